"""`keyshard coordinator`'s flags for who a consumer is (`coordinator.server.
authentication`): each a flag, its KEYSHARD_* variable, a Helm value. The names follow
Kafka's broker settings where one exists (`ssl.principal.mapping.rules`,
`sasl.oauthbearer.*`), so a platform team copies its values across."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from keyshard.api.auth import AdminAuth
from keyshard.api.roles import AdminRoles, read_roles_file
from keyshard.cli.flag_values import positive_ms
from keyshard.coordinator.runtime.authorization import (
    AUTHORIZERS,
    DEFAULT_ACL_CACHE_MS,
    authorizer_for,
)
from keyshard.coordinator.server.authentication import SHARED_TOKEN_PRINCIPAL, Authentication
from keyshard.core.security.identity import PrincipalMapper, parse_principal
from keyshard.core.security.tokens import read_token_file


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


def admin_auth_from(args: argparse.Namespace, consumers: Authentication) -> AdminAuth:
    """The admin API's principals and roles; JWTs are verified as the consumers' are."""
    return AdminAuth(
        token=args.admin_token,
        auth_reads=bool(args.admin_auth_reads),
        tokens=(
            read_token_file(args.admin_tokens_file, "--admin-tokens-file")
            if args.admin_tokens_file
            else None
        ),
        jwt=consumers.jwt,
        roles=read_roles_file(args.admin_roles_file) if args.admin_roles_file else AdminRoles(),
    )


def check_authorization(args: argparse.Namespace) -> None:
    """A bad --authorizer / --acl-file pair, or an ACL file that does not parse, as a
    ValueError naming the flag, before anything starts."""
    if args.authorizer == "acl-file":
        authorizer_for("acl-file", acl_file=args.acl_file)
    elif args.acl_file:
        raise ValueError("--acl-file is read only with --authorizer acl-file")


def authentication_from(args: argparse.Namespace) -> Authentication:
    """The consumers' authentication the flags describe; a bad value is a ValueError
    naming its flag (an IdentityConfigError)."""
    jwt = None
    if args.jwt_jwks_url:
        from keyshard.coordinator.server.jwt_identity import JwtSettings, JwtVerifier

        jwt = JwtVerifier(
            JwtSettings(
                args.jwt_jwks_url,
                issuer=args.jwt_issuer,
                audience=args.jwt_audience,
                principal_claim=args.jwt_principal_claim,
            )
        )
        jwt.check_key_set()
    elif args.jwt_issuer or args.jwt_audience:
        raise ValueError("--jwt-issuer and --jwt-audience check JWTs: give --jwt-jwks-url too")
    return Authentication(
        shared_token=args.auth_token,
        shared_principal=parse_principal(
            args.auth_token_principal, setting="--auth-token-principal"
        ),
        tokens=read_token_file(args.auth_tokens_file) if args.auth_tokens_file else None,
        jwt=jwt,
        mapper=_mapper(args.ssl_principal_mapping_rules),
    )


def _mapper(rules: str) -> PrincipalMapper:
    try:
        return PrincipalMapper(rules)
    except ValueError as err:
        raise ValueError(f"--ssl-principal-mapping-rules: {err}") from None
