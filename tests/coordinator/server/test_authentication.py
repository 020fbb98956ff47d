"""One principal per connection: the shared token, per-principal tokens, the client
certificate's subject, or nobody; each refusal says why without repeating the token."""

from __future__ import annotations

from typing import Any

import pytest

from keyshard.coordinator.server.authentication import (
    SHARED_TOKEN_PRINCIPAL,
    Authentication,
    AuthenticationFailed,
)
from keyshard.core.security.identity import (
    ANONYMOUS,
    IdentityConfigError,
    Principal,
    PrincipalMapper,
    user,
)
from keyshard.core.security.tokens import parse_token_lines

CERT: dict[str, Any] = {
    "subject": ((("organizationName", "Example"),), (("commonName", "alice"),)),
}
TOKENS = parse_token_lines("User:team-a Zq9-token-a\nUser:team-b Zq9-token-b\n", "tokens")


class FakeJwt:
    """A JWT source that knows one token (the real one: coordinator.server.jwt_identity)."""

    def accepts(self, token: str) -> bool:
        return token.count(".") == 2

    async def principal(self, token: str) -> Principal:
        if token == "a.b.c":
            return user("jwt-user")
        raise AuthenticationFailed("invalid JWT: signature")


async def principal(auth: Authentication, token: str | None, cert: Any = None) -> Principal:
    return await auth.principal(token, cert)


async def test_nothing_configured_is_anonymous_or_the_certificate() -> None:
    auth = Authentication()
    assert auth.screen(None, None) is None and auth.screen("anything", None) is None
    assert await principal(auth, None) == ANONYMOUS
    assert await principal(auth, "ignored") == ANONYMOUS
    assert await principal(auth, None, CERT) == user("CN=alice,O=Example")
    mapped = Authentication(mapper=PrincipalMapper("RULE:^CN=(.*?),O=.*$/$1/"))
    assert await principal(mapped, None, CERT) == user("alice")


async def test_the_shared_token_is_a_gate_and_the_certificate_still_names_the_client() -> None:
    auth = Authentication(shared_token="Zq9-shared")
    assert await principal(auth, "Zq9-shared") == SHARED_TOKEN_PRINCIPAL
    assert await principal(auth, "Zq9-shared", CERT) == user("CN=alice,O=Example")
    for wrong in (None, "Zq9-other", 7, "\ud800"):
        assert auth.screen(wrong, CERT) == "invalid or missing auth token"
    with pytest.raises(AuthenticationFailed, match="invalid or missing auth token"):
        await principal(auth, None, CERT)
    named = Authentication(shared_token="Zq9-shared", shared_principal=user("legacy"))
    assert await principal(named, "Zq9-shared") == user("legacy")
    assert "Zq9" not in repr(auth)


async def test_a_per_principal_token_names_its_principal() -> None:
    auth = Authentication(tokens=TOKENS)
    assert await principal(auth, "Zq9-token-a") == user("team-a")
    # A token decides even beside a certificate: it names a principal on its own.
    assert await principal(auth, "Zq9-token-b", CERT) == user("team-b")
    # No token: the certificate, or nobody.
    assert await principal(auth, None, CERT) == user("CN=alice,O=Example")
    with pytest.raises(AuthenticationFailed, match="missing credentials: send a token"):
        await principal(auth, None)
    with pytest.raises(AuthenticationFailed, match="no principal has it") as caught:
        await principal(auth, "Zq9-wrong", CERT)
    assert "Zq9" not in str(caught.value)
    assert auth.screen(["Zq9-token-a"], None) == "invalid auth token: not a string"


async def test_a_jwt_is_verified_when_the_register_is_handled() -> None:
    auth = Authentication(tokens=TOKENS, jwt=FakeJwt())
    assert auth.screen("x.y.z", None) is None  # passed on: verified in `principal`
    assert await principal(auth, "a.b.c") == user("jwt-user")
    assert await principal(auth, "Zq9-token-a") == user("team-a")
    with pytest.raises(AuthenticationFailed, match="invalid JWT"):
        await principal(auth, "x.y.z")
    with pytest.raises(AuthenticationFailed, match="send a token or a JWT"):
        await principal(auth, None)


async def test_a_subject_no_rule_maps_is_refused_naming_the_subject() -> None:
    auth = Authentication(mapper=PrincipalMapper("RULE:^CN=(.*?),OU=svc$/$1/"))
    with pytest.raises(AuthenticationFailed, match=r"no principal mapping rule.*CN=alice"):
        await principal(auth, None, CERT)


def test_the_shared_token_and_identity_tokens_do_not_mix() -> None:
    with pytest.raises(IdentityConfigError, match="not both"):
        Authentication(shared_token="x", tokens=TOKENS)
    assert "2 static token(s)" in Authentication(tokens=TOKENS).describe()
    assert "ANONYMOUS" in Authentication().describe()
    assert "x" not in Authentication(shared_token="x").describe().replace("auth-token", "")
