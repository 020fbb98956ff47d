"""Bearer JWTs verified against an issuer's JWKS: the tokens Kafka's SASL/OAUTHBEARER
takes, with the same settings (`sasl.oauthbearer.jwks.endpoint.url`,
`.expected.issuer`, `.expected.audience`, `.sub.claim.name`), so a client that already
gets a token for Kafka presents the same one here and is the same `User:<sub>`.

The key set is fetched by PyJWT's `PyJWKClient` (in a thread: its HTTP client blocks),
cached for `jwks_refresh_s`, and fetched again for a key id it does not know at most once
per cooldown, so tokens with made-up key ids cannot make the coordinator hammer the
issuer. A token must carry `exp`; every refusal names the check that failed and never
repeats the token.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

import jwt

from keyshard.coordinator.server.authentication import AuthenticationFailed
from keyshard.core.security.identity import IdentityConfigError, Principal, user

#: Asymmetric algorithms only: a JWKS publishes public keys; HS256 with a public key
#: as its secret is the classic forgery.
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA")
_JWT_SHAPE = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")


@dataclass(frozen=True, slots=True)
class JwtSettings:
    jwks_url: str
    issuer: str | None = None
    audience: str | None = None
    principal_claim: str = "sub"
    jwks_refresh_s: float = 300.0
    # The same key id unknown again within this: no second fetch (PyJWKClient's cooldown).
    unknown_key_cooldown_s: float = 10.0
    fetch_timeout_s: float = 5.0
    leeway_s: float = 0.0


class JwtVerifier:
    def __init__(self, settings: JwtSettings) -> None:
        self.settings = settings
        try:
            self._keys = jwt.PyJWKClient(
                settings.jwks_url,
                lifespan=settings.jwks_refresh_s,
                timeout=settings.fetch_timeout_s,
                cooldown_duration=settings.unknown_key_cooldown_s,
            )
        except jwt.PyJWTError as err:  # an address that is no http(s) URL
            raise IdentityConfigError(f"--jwt-jwks-url {settings.jwks_url!r}: {err}") from None

    def check_key_set(self) -> None:
        """Read the key set once, at start: an address that serves none (a typo, an issuer
        this host cannot reach, a page that is no JWKS) stops the coordinator with one
        line instead of refusing every consumer's JWT later. It blocks: call it before the
        event loop runs."""
        try:
            self._keys.get_signing_keys()
        except (jwt.PyJWTError, ValueError) as err:  # ValueError: a body that is no JSON
            raise IdentityConfigError(
                f"--jwt-jwks-url {self.settings.jwks_url}: no key set read from it: {err}"
            ) from None

    def accepts(self, token: str) -> bool:
        return _JWT_SHAPE.fullmatch(token) is not None

    async def principal(self, token: str) -> Principal:
        settings = self.settings
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise AuthenticationFailed("invalid JWT: its header is not readable") from None
        algorithm = header.get("alg")
        if algorithm not in ALGORITHMS:
            accepted = ", ".join(ALGORITHMS)
            raise AuthenticationFailed(
                f"invalid JWT: algorithm {algorithm!r} is not accepted (one of {accepted})"
            )
        try:
            key = await asyncio.to_thread(self._keys.get_signing_key_from_jwt, token)
        except jwt.PyJWKClientConnectionError:
            raise AuthenticationFailed(
                f"cannot verify the JWT: the issuer's key set at {settings.jwks_url} is unreachable"
            ) from None
        except jwt.PyJWKClientError as err:
            raise AuthenticationFailed(f"invalid JWT: {_no_token(str(err), token)}") from None
        except jwt.PyJWTError:
            raise AuthenticationFailed("invalid JWT: its key id is not readable") from None
        required = ["exp", settings.principal_claim]
        if settings.issuer is not None:
            required.append("iss")
        if settings.audience is not None:
            required.append("aud")
        try:
            claims = jwt.decode(
                token, key, algorithms=[algorithm], audience=settings.audience,
                issuer=settings.issuer, leeway=settings.leeway_s,
                options={"require": required, "verify_aud": settings.audience is not None},
            )  # fmt: skip
        except jwt.ExpiredSignatureError:
            raise AuthenticationFailed("invalid JWT: it has expired") from None
        except jwt.InvalidAudienceError:
            raise AuthenticationFailed(
                f"invalid JWT: its audience is not {settings.audience!r}"
            ) from None
        except jwt.InvalidIssuerError:
            raise AuthenticationFailed(
                f"invalid JWT: its issuer is not {settings.issuer!r}"
            ) from None
        except jwt.MissingRequiredClaimError as err:
            raise AuthenticationFailed(f"invalid JWT: it has no {err.claim!r} claim") from None
        except jwt.InvalidSignatureError:
            raise AuthenticationFailed("invalid JWT: its signature does not verify") from None
        except jwt.PyJWTError as err:
            raise AuthenticationFailed(f"invalid JWT: {_no_token(str(err), token)}") from None
        name = claims.get(settings.principal_claim)
        if not isinstance(name, str) or not name:
            raise AuthenticationFailed(
                f"invalid JWT: its {settings.principal_claim!r} claim is not a name"
            )
        return user(name)


def _no_token(message: str, token: str) -> str:
    """A library's message, with the token cut out should it quote it."""
    return message.replace(token, "<token>")
