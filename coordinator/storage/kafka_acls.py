"""The cluster's ACLs of one resource type, read with DescribeAcls.

aiokafka's admin client has no `describe_acls`; its protocol module has the request and
response (`DescribeAclsRequest`, versions 0 and 1), so the request goes through the
coordinator's own `AIOKafkaClient`, which negotiates the version with the broker. One
request per resource type with an ANY filter returns every binding of that type, which
the caller matches itself (`keyshard.core.security.acl`): two requests answer for a
group and any number of topics.

The coordinator's principal needs Describe on the Cluster resource for this; a broker
without an authorizer answers SECURITY_DISABLED. Both are said in full.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka.errors import ClusterAuthorizationFailedError, KafkaError, for_code
from aiokafka.protocol.admin import DescribeAclsRequest

from keyshard.coordinator.storage.base import StoreError
from keyshard.core.security.acl import (
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)

# Kafka's wire codes (org.apache.kafka.common.resource / acl).
RESOURCE_CODES = {
    ResourceType.TOPIC: 2,
    ResourceType.GROUP: 3,
    ResourceType.CLUSTER: 4,
    ResourceType.TRANSACTIONAL_ID: 5,
}
_PATTERN_ANY = 1
_PATTERNS = {3: PatternType.LITERAL, 4: PatternType.PREFIXED}
_OPERATION_ANY = 1
_OPERATIONS = {
    2: Operation.ALL, 3: Operation.READ, 4: Operation.WRITE, 5: Operation.CREATE,
    6: Operation.DELETE, 7: Operation.ALTER, 8: Operation.DESCRIBE,
    9: Operation.CLUSTER_ACTION, 10: Operation.DESCRIBE_CONFIGS,
    11: Operation.ALTER_CONFIGS, 12: Operation.IDEMPOTENT_WRITE,
}  # fmt: skip
_PERMISSION_ANY = 1
_PERMISSIONS = {2: Permission.DENY, 3: Permission.ALLOW}
_SECURITY_DISABLED = 54


async def describe_acls(
    client: Any, resource: ResourceType, timeout: float, principal: str
) -> tuple[AclBinding, ...]:
    """Every binding of `resource`'s type on the cluster; a refusal is a StoreError
    saying what to grant (`principal`: the coordinator's, for that message)."""
    request = DescribeAclsRequest(
        RESOURCE_CODES[resource], None, _PATTERN_ANY, None, None, _OPERATION_ANY,
        _PERMISSION_ANY,
    )  # fmt: skip
    try:
        response = await asyncio.wait_for(client.send(client.get_random_node(), request), timeout)
    except (KafkaError, OSError, TimeoutError) as err:
        raise StoreError(f"cannot read the cluster's ACLs: {type(err).__name__}: {err}") from err
    code = response.error_code
    if code == _SECURITY_DISABLED:
        raise StoreError(
            "the cluster has no authorizer, so it holds no ACLs to authorize consumers "
            "with: use --authorizer acl-file, or none"
        )
    if code != 0:
        error = for_code(code)
        if error is ClusterAuthorizationFailedError:
            raise StoreError(
                f"Kafka refused DescribeAcls: grant {principal} Describe on the Cluster "
                f"(kafka-acls --add --allow-principal {principal} --operation Describe "
                "--cluster)"
            )
        raise StoreError(f"Kafka refused DescribeAcls: {error.__name__}: {response.error_message}")
    return tuple(_bindings(response.resources, resource))


def _bindings(resources: Any, wanted: ResourceType) -> list[AclBinding]:
    bindings = []
    for resource_type, name, pattern, acls in resources:
        if resource_type != RESOURCE_CODES[wanted] or pattern not in _PATTERNS:
            continue
        for principal, host, operation, permission in acls:
            if operation not in _OPERATIONS or permission not in _PERMISSIONS:
                continue  # one this coordinator never asks about
            bindings.append(
                AclBinding(
                    principal=principal,
                    permission=_PERMISSIONS[permission],
                    operation=_OPERATIONS[operation],
                    resource_type=wanted,
                    pattern_type=_PATTERNS[pattern],
                    name=name,
                    host=host,
                )
            )
    return bindings
