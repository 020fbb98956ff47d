"""Admin roles: who may look at a group through the admin API, and who may change it.

Two roles, scoped to groups, granted to principals (the same `User:<name>` a consumer or a
Kafka ACL names):

* **viewer**: the group's views (members, positions, handoffs, key lookups, its audit
  trail), when reads are protected (`--admin-auth-reads`); open otherwise, as before;
* **operator**: a viewer that may also change the group: its config, a rebalance, fencing
  a member, resetting its positions.

`--admin-roles-file` holds a grant a line: `<principal> <viewer|operator> <group> ...`,
where a group is a name, `prefix*` or `*` (every group); `#` starts a comment. The
`--admin-token` holder is `User:keyshard-admin`, operator of every group, as it always
was. What needs every group (`/metrics`, which shows them all) needs a grant of `*`.

Nothing here does I/O but reading that file.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from keyshard.core.security.identity import IdentityConfigError, Principal, parse_principal, user
from keyshard.core.security.line_files import fields_by_line, read_line_file

#: Who holds the shared `--admin-token`.
ADMIN_TOKEN_PRINCIPAL = user("keyshard-admin")
EVERY_GROUP = "*"


class AdminRolesError(ValueError):
    """A roles file that cannot be used, said in one line naming the line."""


class Role(IntEnum):
    """Ordered: an operator may do what a viewer may."""

    VIEWER = 1
    OPERATOR = 2

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, slots=True)
class RoleGrant:
    principal: str
    role: Role
    groups: tuple[str, ...]

    def covers(self, group: str | None) -> bool:
        """Whether it reaches `group` (None: every group, which only `*` reaches)."""
        for pattern in self.groups:
            if pattern == EVERY_GROUP:
                return True
            if group is None:
                continue
            if pattern.endswith("*") and group.startswith(pattern[:-1]):
                return True
            if pattern == group:
                return True
        return False


@dataclass(frozen=True, slots=True)
class AdminRoles:
    grants: tuple[RoleGrant, ...] = ()

    def role(self, principal: Principal, group: str | None) -> Role | None:
        """The highest role `principal` holds on `group` (None: every group), or None."""
        if principal == ADMIN_TOKEN_PRINCIPAL:
            return Role.OPERATOR
        held = [g.role for g in self.grants if g.principal == str(principal) and g.covers(group)]
        return max(held, default=None)

    def refusal(
        self, principal: Principal, needed: Role, group: str | None, action: str
    ) -> str | None:
        """Why `principal` may not `action` (on `group`), or None."""
        held = self.role(principal, group)
        if held is not None and held >= needed:
            return None
        where = "every group" if group is None else f"group {group!r}"
        if held is None:
            return f"{principal} may not {action}: it has no admin role on {where}"
        return f"{principal} may not {action}: it is a {held} of {where}, and that needs {needed}"


def parse_role_lines(text: str, source: str) -> AdminRoles:
    grants: list[RoleGrant] = []
    for where, fields in fields_by_line(text, source, AdminRolesError):
        if len(fields) < 3:
            raise AdminRolesError(
                f"{where}: expected '<principal> <viewer|operator> <group> ...' (a group: a "
                "name, prefix* or *)"
            )
        try:
            principal = parse_principal(fields[0], setting=where)
        except IdentityConfigError as err:
            raise AdminRolesError(str(err)) from None
        try:
            role = Role[fields[1].upper()]
        except KeyError:
            raise AdminRolesError(
                f"{where}: {fields[1]!r} is not a role (viewer or operator)"
            ) from None
        grants.append(RoleGrant(str(principal), role, tuple(fields[2:])))
    return AdminRoles(tuple(grants))


def read_roles_file(path: str, flag: str = "--admin-roles-file") -> AdminRoles:
    return parse_role_lines(read_line_file(path, flag, AdminRolesError), f"{flag} {path}")
