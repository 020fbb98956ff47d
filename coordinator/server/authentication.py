"""Who a consumer connection is: one principal per connection, decided at its Register.

The sources are the ones platform teams already run, and exactly one decides:

* **A shared token** (`--auth-token`): a gate every Register must pass, as it always
  was. The connection is the principal of its client certificate when the channel runs
  mutual TLS, else `--auth-token-principal` (one principal for every holder: no
  isolation between them).
* **Identity tokens**: a per-principal token from `--auth-tokens-file`
  (`keyshard.core.security.tokens`) or a bearer JWT verified against an issuer's JWKS
  (`coordinator.server.jwt_identity`, what Kafka's SASL/OAUTHBEARER uses). A Register
  that carries a token is that token's principal, or refused; one without a token is its
  client certificate's principal, or refused when it has none. A shared token and
  identity tokens together are a configuration error: which one decides would be a
  rule nobody remembers.
* **Neither**: the client certificate's principal under mutual TLS, else
  `User:ANONYMOUS`, Kafka's name for an unauthenticated client.

A certificate's subject is mapped with Kafka's `ssl.principal.mapping.rules`
(`--ssl-principal-mapping-rules`), so one ACL names a client on the cluster and here.
What a refusal says never repeats what the client sent as a token.

The cheap part (shared and static tokens: a digest and a comparison) also runs in the
pre-authentication screen (`coordinator.server.preauth`), before the Register is
validated; a JWT is verified when the Register is handled.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from typing import Any, Protocol

from keyshard.core.security.identity import (
    ANONYMOUS,
    IdentityConfigError,
    Principal,
    PrincipalMapper,
    distinguished_name,
    subject_of,
    user,
)
from keyshard.core.security.tokens import TokenTable

#: `--auth-token-principal`'s default: who a holder of the shared token is.
SHARED_TOKEN_PRINCIPAL = user("keyshard-shared-token")


class AuthenticationFailed(Exception):
    """A Register whose credentials name nobody; the message is safe to send and log."""


class TokenVerifier(Protocol):
    """A source of identity tokens checked when the Register is handled (a JWT)."""

    def accepts(self, token: str) -> bool:
        """Whether `token` is of its kind (a JWT has three dot-separated parts)."""
        ...

    async def principal(self, token: str) -> Principal:
        """Whose `token` is; raises AuthenticationFailed saying why it is not valid."""
        ...


@dataclass(frozen=True, slots=True)
class Authentication:
    shared_token: str | None = field(default=None, repr=False)
    shared_principal: Principal = SHARED_TOKEN_PRINCIPAL
    tokens: TokenTable | None = None
    jwt: TokenVerifier | None = None
    mapper: PrincipalMapper = field(default_factory=PrincipalMapper)

    def __post_init__(self) -> None:
        if self.shared_token is not None and (self.tokens is not None or self.jwt is not None):
            raise IdentityConfigError(
                "give --auth-token (one token for every consumer) or per-principal tokens "
                "(--auth-tokens-file, --jwt-jwks-url), not both"
            )

    @property
    def identity_tokens(self) -> bool:
        return self.tokens is not None or self.jwt is not None

    def describe(self) -> str:
        """How consumers authenticate, for the start-up log line (no secret in it)."""
        if self.shared_token is not None:
            return f"consumers present the shared --auth-token (as {self.shared_principal})"
        sources = []
        if self.tokens is not None:
            sources.append(f"{len(self.tokens)} static token(s)")
        if self.jwt is not None:
            sources.append("JWTs")
        if sources:
            return "consumers authenticate with " + " or ".join(sources)
        return "consumers are not authenticated (User:ANONYMOUS)"

    def screen(self, token: object, certificate: dict[str, Any] | None) -> str | None:
        """Why a Register carrying `token` must be refused before it is validated, or
        None to go on (a JWT is verified later, in `principal`)."""
        if self.shared_token is not None:
            if not isinstance(token, str) or not _equal(token, self.shared_token):
                return "invalid or missing auth token"
            return None
        if not self.identity_tokens:
            return None
        if token is None:
            return None if subject_of(certificate) else _missing(self)
        if not isinstance(token, str):
            return "invalid auth token: not a string"
        if self.tokens is not None and self.tokens.principal(token) is not None:
            return None
        if self.jwt is not None and self.jwt.accepts(token):
            return None
        return "invalid auth token: no principal has it"

    async def principal(self, token: str | None, certificate: dict[str, Any] | None) -> Principal:
        """The connection's principal (see the module's docstring)."""
        refusal = self.screen(token, certificate)
        if refusal is not None:
            raise AuthenticationFailed(refusal)
        if self.identity_tokens and token is not None:
            found = self.tokens.principal(token) if self.tokens is not None else None
            if found is not None:
                return found
            assert self.jwt is not None  # the screen let only a token or a JWT through
            return await self.jwt.principal(token)
        subject = subject_of(certificate)
        if subject is not None:
            try:
                return self.mapper.principal(distinguished_name(subject))
            except IdentityConfigError as err:
                raise AuthenticationFailed(str(err)) from None
        return self.shared_principal if self.shared_token is not None else ANONYMOUS


def _missing(authentication: Authentication) -> str:
    kinds = [
        kind
        for kind, on in (("a token", authentication.tokens), ("a JWT", authentication.jwt))
        if on is not None
    ]
    return f"missing credentials: send {' or '.join(kinds)} as auth_token, or a client certificate"


def _equal(given: str, expected: str) -> bool:
    # Total: a string that is no UTF-8 (a lone surrogate) compares, unequal, not raises.
    return hmac.compare_digest(
        given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass")
    )
