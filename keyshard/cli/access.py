"""What `keyshard coordinator`'s access flags (`keyshard.cli.access_flags`) build: the
consumers' authentication, the authorizer's check, the admin API's principals and roles.
It imports the server extra (the admin API's FastAPI side, PyJWT), so `keyshard.cli.main`
imports it only when the coordinator runs."""

from __future__ import annotations

import argparse

from keyshard.api.auth import AdminAuth
from keyshard.api.roles import AdminRoles, read_roles_file
from keyshard.coordinator.runtime.authorization import authorizer_for
from keyshard.coordinator.server.authentication import Authentication
from keyshard.core.security.identity import PrincipalMapper, parse_principal
from keyshard.core.security.tokens import read_token_file


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
