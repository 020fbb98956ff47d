"""Principals on a real listener: mutual TLS names each connection after its client
certificate, the admin view shows it, and a claim is adopted only from the principal
that owned it (member ids are public).

An in-process coordinator behind its real TLS listener; the clients are raw channels.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

import pytest
import trustme

from keyshard.coordinator.runtime.authorization import AclFileAuthorizer
from keyshard.coordinator.runtime.reauthorize import reauthorize
from keyshard.coordinator.server.authentication import Authentication
from keyshard.core.protocol.channel import Channel, RemoteError
from keyshard.core.protocol.messages import (
    ErrorCode,
    MemberClaim,
    Message,
    PingRequest,
    PingResponse,
    RegisterRequest,
    RegisterResponse,
    StartFetcherRequest,
    StartFetcherResponse,
)
from keyshard.core.security.identity import PrincipalMapper
from keyshard.core.security.tls import client_context, server_context
from keyshard.core.security.tokens import parse_token_lines
from tests.coordinator.server.inprocess import running_coordinator
from tests.coordinator.server.test_listener import TIMEOUT, until

RULES = "RULE:^CN=(.*?),OU=(.*?),.*$/$2.$1/L, DEFAULT"


class Pki:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ca = trustme.CA(organization_name="Example")
        self.ca.cert_pem.write_to_path(str(directory / "ca.pem"))
        server = self.ca.issue_cert("127.0.0.1")
        server.private_key_and_cert_chain_pem.write_to_path(str(directory / "server.pem"))

    def server(self) -> ssl.SSLContext:
        d = self.directory
        return server_context(
            cert_file=str(d / "server.pem"),
            client_ca_file=str(d / "ca.pem"),
            require_client_cert=True,
        )

    def client(self, common_name: str, unit: str) -> ssl.SSLContext:
        issued = self.ca.issue_cert(
            f"{common_name}@example.com", common_name=common_name, organization_unit_name=unit
        )
        path = self.directory / f"{common_name}.pem"
        issued.private_key_and_cert_chain_pem.write_to_path(str(path))
        return client_context(ca_file=str(self.directory / "ca.pem"), cert_file=str(path))


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


def answer(channel: Channel, message: Message) -> None:
    match message:
        case PingRequest():
            channel.reply(message, PingResponse(correlation_id=0, member_epoch=1))
        case StartFetcherRequest():
            reply = StartFetcherResponse(correlation_id=0, member_epoch=message.member_epoch)
            channel.reply(message, reply)


async def register(
    port: int, tls: ssl.SSLContext, claim: MemberClaim | None = None, token: str | None = None
) -> tuple[Channel, RegisterResponse]:
    channel = await Channel.connect("127.0.0.1", port, ssl=tls, name="member")
    channel.set_request_handler(answer)
    channel.start()
    request = RegisterRequest(
        correlation_id=0, group="g", topics=["t"], consumer_name="c", session_timeout_ms=5000,
        claim=claim, auth_token=token,
    )  # fmt: skip
    response = await channel.request(request, timeout=TIMEOUT)
    assert isinstance(response, RegisterResponse)
    return channel, response


async def test_a_claim_is_adopted_only_from_the_principal_that_owned_it(pki: Pki) -> None:
    authentication = Authentication(mapper=PrincipalMapper(RULES))
    async with running_coordinator(tls=pki.server(), authentication=authentication) as server:
        alice_tls, bob_tls = pki.client("alice", "team-a"), pki.client("bob", "team-b")
        groups = server.runtime.group_states()
        channel, alice = await register(server.port, alice_tls)
        member = groups["g"].members[alice.member_id]
        assert member.principal == "User:team-a.alice"
        await until(lambda: member.owned.size == 65536, "alice owns every slot")
        await channel.aclose()
        await until(lambda: alice.member_id in groups["g"].claims, "alice's pending claim")
        assert groups["g"].claims[alice.member_id].principal == "User:team-a.alice"

        claim = MemberClaim(
            member_id=alice.member_id, member_epoch=alice.member_epoch, owned=[(0, 65535)],
            positions=[], coordinator_epoch=alice.coordinator_epoch,
        )  # fmt: skip
        # Bob names alice's member id: he registers as a new member, owning nothing yet,
        # and alice's claim still waits for her.
        bob_channel, bob = await register(server.port, bob_tls, claim)
        assert bob.member_id != alice.member_id and bob.adopted == []
        assert groups["g"].members[bob.member_id].principal == "User:team-b.bob"
        assert alice.member_id in groups["g"].claims
        # Alice, with her own certificate, keeps her ranges.
        back_channel, back = await register(server.port, pki.client("alice", "team-a"), claim)
        assert back.member_id == alice.member_id and back.adopted == [(0, 65535)]
        assert groups["g"].members[alice.member_id].principal == "User:team-a.alice"
        await bob_channel.aclose()
        await back_channel.aclose()


async def test_a_token_names_the_principal_and_a_wrong_one_is_refused(pki: Pki) -> None:
    authentication = Authentication(tokens=parse_token_lines("User:svc Zq9-svc\n", "tokens"))
    async with running_coordinator(tls=pki.server(), authentication=authentication) as server:
        channel, member = await register(
            server.port, pki.client("alice", "team-a"), token="Zq9-svc"
        )
        assert server.runtime.group_states()["g"].members[member.member_id].principal == "User:svc"
        await channel.aclose()
        with pytest.raises(RemoteError) as refused:
            await register(server.port, pki.client("alice", "team-a"), token="Zq9-wrong")
        assert refused.value.code is ErrorCode.AUTHENTICATION_FAILED
        assert "no principal has it" in refused.value.message
        assert "Zq9" not in refused.value.message


async def test_a_principal_registers_only_where_its_acls_let_it(pki: Pki, tmp_path: Path) -> None:
    acls = tmp_path / "acls"
    acls.write_text(
        "User:team-a.alice allow Read Group literal g\n"
        "User:team-a.alice allow Read Topic literal t\n"
    )
    async with running_coordinator(
        tls=pki.server(),
        authentication=Authentication(mapper=PrincipalMapper(RULES)),
        authorizer=AclFileAuthorizer(str(acls)),
    ) as server:
        channel, _ = await register(server.port, pki.client("alice", "team-a"))
        await channel.aclose()
        with pytest.raises(RemoteError) as refused:
            await register(server.port, pki.client("bob", "team-b"))
        assert refused.value.code is ErrorCode.AUTHORIZATION_FAILED
        assert refused.value.message == (
            "User:team-b.bob may not join group 'g': it lacks Read on Group 'g' (no ACL allows it)"
        )
        assert server.runtime.group_states()["g"].members.keys() <= {
            m for m, member in server.runtime.group_states()["g"].members.items()
            if member.principal == "User:team-a.alice"
        }  # fmt: skip


async def test_a_member_whose_permission_is_revoked_is_fenced_and_not_let_back(
    pki: Pki, tmp_path: Path
) -> None:
    acls = tmp_path / "acls"
    acls.write_text(
        "User:team-a.alice allow Read Group literal g\n"
        "User:team-a.alice allow Read Topic literal t\n"
        "User:team-b.bob allow Read Group literal g\n"
        "User:team-b.bob allow Read Topic literal t\n"
    )
    async with running_coordinator(
        tls=pki.server(),
        authentication=Authentication(mapper=PrincipalMapper(RULES)),
        authorizer=AclFileAuthorizer(str(acls)),
    ) as server:
        alice, _ = await register(server.port, pki.client("alice", "team-a"))
        bob, bob_member = await register(server.port, pki.client("bob", "team-b"))
        assert await reauthorize(server.runtime) == 0  # nothing revoked: nobody fenced
        acls.write_text("User:team-b.bob allow Read Group literal g\n"
                        "User:team-b.bob allow Read Topic literal t\n")  # fmt: skip
        os.utime(acls, ns=(1, 1))
        assert await reauthorize(server.runtime) == 1
        reason = await alice.wait_closed()
        assert "User:team-a.alice may not join group 'g'" in reason
        members = server.runtime.group_states()["g"].members
        assert set(members) == {bob_member.member_id}
        with pytest.raises(RemoteError) as refused:
            await register(server.port, pki.client("alice", "team-a"))
        assert refused.value.code is ErrorCode.AUTHORIZATION_FAILED
        await bob.aclose()
