"""Kafka's ACL model, and its decision: may this principal do this to that resource?

The same bindings whether they come from the cluster (DescribeAcls) or from an ACL file,
and the same rules as Kafka's `StandardAuthorizer`, so a grant means here what it means
on the brokers:

* a binding applies when its resource type is the resource's, its pattern matches the
  name (LITERAL: equal, or the wildcard `*`; PREFIXED: a prefix of it), its principal is
  the principal or `User:*`, and its host is the client's address or `*`;
* a DENY that applies for the operation (or ALL) wins over every ALLOW;
* an ALLOW applies for the operation, for ALL, and for DESCRIBE when it allows READ,
  WRITE, DELETE or ALTER (Kafka's implied Describe);
* nothing that applies: denied (the broker's default, `allow.everyone.if.no.acl.found`
  false).

The ACL file is one binding a line, `<principal> <allow|deny> <operation> <resource type>
<literal|prefixed> <name> [host]` (quotes around a principal with spaces, `#` comments).
Nothing here does I/O but reading that file.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from keyshard.core.security.identity import IdentityConfigError, Principal, parse_principal
from keyshard.core.security.line_files import fields_by_line, read_line_file


class AclConfigError(ValueError):
    """An ACL file that cannot be used, said in one line naming the line."""


class ResourceType(StrEnum):
    TOPIC = "Topic"
    GROUP = "Group"
    CLUSTER = "Cluster"
    TRANSACTIONAL_ID = "TransactionalId"


class PatternType(StrEnum):
    LITERAL = "Literal"
    PREFIXED = "Prefixed"


class Operation(StrEnum):
    ALL = "All"
    READ = "Read"
    WRITE = "Write"
    CREATE = "Create"
    DELETE = "Delete"
    ALTER = "Alter"
    DESCRIBE = "Describe"
    CLUSTER_ACTION = "ClusterAction"
    DESCRIBE_CONFIGS = "DescribeConfigs"
    ALTER_CONFIGS = "AlterConfigs"
    IDEMPOTENT_WRITE = "IdempotentWrite"


class Permission(StrEnum):
    ALLOW = "Allow"
    DENY = "Deny"


_IMPLY_DESCRIBE = {Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER}
WILDCARD = "*"


@dataclass(frozen=True, slots=True)
class AclBinding:
    principal: str  # "User:alice", or "User:*"
    permission: Permission
    operation: Operation
    resource_type: ResourceType
    pattern_type: PatternType
    name: str
    host: str = WILDCARD

    def applies(self, principal: Principal, host: str, resource: ResourceType, name: str) -> bool:
        if self.resource_type is not resource:
            return False
        if self.pattern_type is PatternType.LITERAL:
            if self.name not in (name, WILDCARD):
                return False
        elif not name.startswith(self.name):
            return False
        if self.principal != str(principal) and self.principal != f"{principal.kind}:{WILDCARD}":
            return False
        return self.host in (host, WILDCARD)

    def grants(self, operation: Operation) -> bool:
        if self.operation in (operation, Operation.ALL):
            return True
        return operation is Operation.DESCRIBE and self.operation in _IMPLY_DESCRIBE


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    denied_by: AclBinding | None = None  # the DENY that decided, if one did


def decide(
    bindings: Iterable[AclBinding],
    principal: Principal,
    host: str,
    operation: Operation,
    resource: ResourceType,
    name: str,
) -> Decision:
    allowed = False
    for binding in bindings:
        if not binding.applies(principal, host, resource, name) or not binding.grants(operation):
            continue
        if binding.permission is Permission.DENY:
            return Decision(False, binding)
        allowed = True
    return Decision(allowed)


def register_refusal(
    bindings: Sequence[AclBinding],
    principal: Principal,
    host: str,
    group: str,
    topics: Sequence[str],
) -> str | None:
    """Why `principal` (from `host`) may not join `group` reading `topics`, as a Kafka
    consumer may not: Read on the Group, Read on every Topic. None: it may."""
    checks = [(ResourceType.GROUP, group)] + [(ResourceType.TOPIC, t) for t in topics]
    for resource, name in checks:
        decision = decide(bindings, principal, host, Operation.READ, resource, name)
        if not decision.allowed:
            why = "an ACL denies it" if decision.denied_by else "no ACL allows it"
            return (
                f"{principal} may not join group {group!r}: it lacks Read on "
                f"{resource.value} {name!r} ({why})"
            )
    return None


# ---- the ACL file ----------------------------------------------------------------------------


def _choice(enum: type[StrEnum], text: str, what: str, where: str) -> StrEnum:
    for member in enum:
        if member.value.lower() == text.lower() or member.name.lower() == text.lower():
            return member
    known = ", ".join(m.value for m in enum)
    raise AclConfigError(f"{where}: {text!r} is not a {what} (one of {known})")


def parse_acl_lines(text: str, source: str) -> tuple[AclBinding, ...]:
    bindings: list[AclBinding] = []
    for where, fields in fields_by_line(text, source, AclConfigError):
        if len(fields) not in (6, 7):
            raise AclConfigError(
                f"{where}: expected '<principal> <allow|deny> <operation> <resource type> "
                f"<literal|prefixed> <name> [host]' ({len(fields)} fields)"
            )
        try:
            principal = str(parse_principal(fields[0], setting=where))
        except IdentityConfigError as err:
            raise AclConfigError(str(err)) from None
        permission, operation, resource, pattern = (
            _choice(enum, value, what, where)
            for enum, value, what in (
                (Permission, fields[1], "permission"),
                (Operation, fields[2], "operation"),
                (ResourceType, fields[3], "resource type"),
                (PatternType, fields[4], "pattern type"),
            )
        )
        bindings.append(
            AclBinding(
                principal=principal,
                permission=Permission(permission),
                operation=Operation(operation),
                resource_type=ResourceType(resource),
                pattern_type=PatternType(pattern),
                name=fields[5],
                host=fields[6] if len(fields) == 7 else WILDCARD,
            )
        )
    return tuple(bindings)


def read_acl_file(path: str, flag: str = "--acl-file") -> tuple[AclBinding, ...]:
    return parse_acl_lines(read_line_file(path, flag, AclConfigError), f"{flag} {path}")
