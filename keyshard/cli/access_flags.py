"""`keyshard coordinator`'s flags for who a consumer is (`coordinator.server.
authentication`): each a flag, its KEYSHARD_* variable, a Helm value. The names follow
Kafka's broker settings where one exists (`ssl.principal.mapping.rules`,
`sasl.oauthbearer.*`), so a platform team copies its values across. What the flags build
is in `keyshard.cli.access`, which needs the server extra: `keyshard --help` does not.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from keyshard.cli.flag_values import positive_ms
from keyshard.coordinator.runtime.authorization import AUTHORIZERS, DEFAULT_ACL_CACHE_MS
from keyshard.coordinator.server.authentication import SHARED_TOKEN_PRINCIPAL


def add_identity_flags(coord: argparse.ArgumentParser, add: Callable[..., None]) -> None:
    """`add` is the parser's flag adder (keyshard.cli.parser._add: it reads the variable)."""
    add(
        coord,
        "--auth-token-principal",
        default=str(SHARED_TOKEN_PRINCIPAL),
        help="the principal a consumer presenting --auth-token is, when no client "
        "certificate names it",
    )
    add(
        coord,
        "--auth-tokens-file",
        default=None,
        help="file of per-principal tokens, a line each: '<principal> <token>' or "
        "'<principal> sha256:<hex>' (instead of --auth-token)",
    )
    add(
        coord,
        "--ssl-principal-mapping-rules",
        default="DEFAULT",
        help="how a client certificate's subject becomes a principal, as Kafka's "
        "ssl.principal.mapping.rules (RULE:pattern/replacement/[LU], DEFAULT)",
    )
    add(
        coord,
        "--jwt-jwks-url",
        default=None,
        help="accept bearer JWTs signed by a key of this JWKS (Kafka's "
        "sasl.oauthbearer.jwks.endpoint.url)",
    )
    add(coord, "--jwt-issuer", default=None, help="a JWT's required 'iss' claim")
    add(coord, "--jwt-audience", default=None, help="a JWT's required 'aud' claim")
    add(
        coord,
        "--jwt-principal-claim",
        default="sub",
        help="the JWT claim that names the principal (Kafka's sasl.oauthbearer.sub.claim.name)",
    )


def add_authorization_flags(coord: argparse.ArgumentParser, add: Callable[..., None]) -> None:
    add(
        coord,
        "--authorizer",
        choices=AUTHORIZERS,
        default="none",
        help="who may join which group: none (everyone authenticated), kafka (the "
        "cluster's ACLs: Read on the Group and its Topics; needs Describe on the "
        "Cluster) or acl-file (--acl-file)",
    )
    add(
        coord,
        "--acl-file",
        default=None,
        help="ACLs for --authorizer acl-file, a line each: '<principal> <allow|deny> "
        "<operation> <resource type> <literal|prefixed> <name> [host]'; read again when "
        "it changes",
    )
    add(
        coord,
        "--acl-cache-ms",
        type=positive_ms,
        default=DEFAULT_ACL_CACHE_MS,
        help="--authorizer kafka: the cluster's ACLs are read again after this, so a grant "
        "or a revocation takes effect within it",
    )


def add_admin_access_flags(coord: argparse.ArgumentParser, add: Callable[..., None]) -> None:
    add(
        coord,
        "--admin-tokens-file",
        default=None,
        help="file of per-principal admin API tokens, as --auth-tokens-file (beside "
        "--admin-token, whose holder is User:keyshard-admin, operator of every group)",
    )
    add(
        coord,
        "--admin-roles-file",
        default=None,
        help="admin roles, a line each: '<principal> <viewer|operator> <group> ...' (a "
        "group: a name, prefix* or *); a viewer reads, an operator also changes its groups",
    )
