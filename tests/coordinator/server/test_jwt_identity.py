"""Bearer JWTs against an issuer's JWKS, served by a local HTTP server with a key made
here: the subject is the principal; expired, foreign, wrongly signed or wrongly
addressed tokens are refused naming the check."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from fastapi.security import HTTPAuthorizationCredentials
from jwt.algorithms import RSAAlgorithm

from keyshard.api.auth import AdminAuth, AdminAuthError
from keyshard.coordinator.server.authentication import Authentication, AuthenticationFailed
from keyshard.coordinator.server.jwt_identity import JwtSettings, JwtVerifier
from keyshard.core.security.identity import IdentityConfigError, user

ISSUER = "https://issuer.example"


class Issuer:
    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.fetches = 0
        public = json.loads(RSAAlgorithm.to_jwk(self.key.public_key()))
        self.jwks = {"keys": [{**public, "kid": "k1", "use": "sig", "alg": "RS256"}]}

    def token(self, kid: str = "k1", key: Any = None, **claims: Any) -> str:
        body = {"sub": "team-a", "iss": ISSUER, "aud": "keyshard", "exp": time.time() + 60}
        body.update(claims)
        body = {k: v for k, v in body.items() if v is not None}
        return jwt.encode(body, key or self.key, algorithm="RS256", headers={"kid": kid})


@pytest.fixture
def issuer() -> Iterator[tuple[Issuer, str]]:
    state = Issuer()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.fetches += 1
            body = json.dumps(state.jwks).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}/jwks.json"
    finally:
        server.shutdown()
        server.server_close()


def verifier(url: str, **settings: Any) -> JwtVerifier:
    return JwtVerifier(JwtSettings(url, issuer=ISSUER, audience="keyshard", **settings))


async def test_a_valid_token_is_its_subject(issuer: tuple[Issuer, str]) -> None:
    state, url = issuer
    auth = Authentication(jwt=verifier(url))
    assert await auth.principal(state.token(), None) == user("team-a")
    assert await auth.principal(state.token(sub="team-b"), None) == user("team-b")
    assert state.fetches == 1  # the key set is cached
    named = verifier(url, principal_claim="client_id")
    assert await named.principal(state.token(client_id="svc-7")) == user("svc-7")
    with pytest.raises(AuthenticationFailed, match="its 'client_id' claim is not a name"):
        await named.principal(state.token(client_id=7))


@pytest.mark.parametrize(
    ("claims", "complaint"),
    [
        ({"exp": time.time() - 120}, "it has expired"),
        ({"exp": None}, "it has no 'exp' claim"),
        ({"aud": "other"}, "its audience is not 'keyshard'"),
        ({"iss": "https://elsewhere"}, "its issuer is not"),
        ({"sub": None}, "it has no 'sub' claim"),
        ({"sub": 7}, "Subject must be a string"),
    ],
)
async def test_a_token_failing_a_check_is_refused_naming_it(
    issuer: tuple[Issuer, str], claims: dict[str, Any], complaint: str
) -> None:
    state, url = issuer
    token = state.token(**claims)
    with pytest.raises(AuthenticationFailed, match=complaint) as caught:
        await verifier(url).principal(token)
    assert token not in str(caught.value)


async def test_forged_and_foreign_tokens_are_refused(issuer: tuple[Issuer, str]) -> None:
    state, url = issuer
    check = verifier(url, unknown_key_cooldown_s=60)
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with pytest.raises(AuthenticationFailed, match="signature does not verify"):
        await check.principal(state.token(key=other))
    with pytest.raises(AuthenticationFailed, match="Unable to find a signing key"):
        await check.principal(state.token(kid="made-up"))
    fetched = state.fetches
    with pytest.raises(AuthenticationFailed, match="Unable to find a signing key"):
        await check.principal(state.token(kid="made-up-too"))
    assert state.fetches == fetched  # no second fetch within the cooldown
    symmetric = jwt.encode({"sub": "x", "exp": time.time() + 60}, "s" * 32, algorithm="HS256")
    with pytest.raises(AuthenticationFailed, match="algorithm 'HS256' is not accepted"):
        await check.principal(symmetric)
    with pytest.raises(AuthenticationFailed, match="header is not readable"):
        await check.principal("e30.e30.x")
    assert not check.accepts("no-dots") and check.accepts(state.token())


async def test_an_unreachable_issuer_is_said(issuer: tuple[Issuer, str]) -> None:
    state, _ = issuer
    check = JwtVerifier(JwtSettings("http://127.0.0.1:9/jwks.json", fetch_timeout_s=1))
    with pytest.raises(AuthenticationFailed, match=r"key set at .* is unreachable"):
        await check.principal(state.token())


def test_the_key_set_is_read_at_start_and_one_that_is_not_there_is_said(
    issuer: tuple[Issuer, str],
) -> None:
    state, url = issuer
    verifier(url).check_key_set()
    assert state.fetches == 1
    state.jwks = {"keys": []}
    with pytest.raises(IdentityConfigError, match=r"--jwt-jwks-url .*: no key set read from it"):
        verifier(url).check_key_set()
    with pytest.raises(IdentityConfigError, match="no key set read from it"):
        verifier("http://127.0.0.1:9/jwks.json").check_key_set()
    with pytest.raises(
        IdentityConfigError, match=re.escape("--jwt-jwks-url 'file:///etc/jwks.json'")
    ):
        verifier("file:///etc/jwks.json")


async def test_a_jwt_cannot_name_the_admin_token_holder(issuer: tuple[Issuer, str]) -> None:
    state, url = issuer
    auth = AdminAuth(jwt=verifier(url))
    bearer = HTTPAuthorizationCredentials(scheme="Bearer", credentials=state.token())
    assert await auth.principal(bearer) == user("team-a")
    forged = HTTPAuthorizationCredentials(
        scheme="Bearer", credentials=state.token(sub="keyshard-admin")
    )
    with pytest.raises(AdminAuthError, match="may not name User:keyshard-admin") as caught:
        await auth.principal(forged)
    assert caught.value.status_code == 403
