"""What a failed connection to the coordinator says about the member's own settings.

A wrong setting looks like a network problem from below. An address that is keyshard's
admin API answers our first frame with an HTTP response, which read as a frame is a
length of 1213486160 bytes. A wrong CA is an `SSLCertVerificationError`; a consumer
without TLS at a TLS coordinator (or the reverse) sees a closed connection or garbage; and
with TLS 1.3 a coordinator that requires a client certificate refuses ours only after
*our* side of the handshake has finished, so the refusal arrives as the connection closing
before a single frame. Retrying fixes none of these. These functions turn each into a
sentence naming the setting to change; the membership raises it as `ConsumerError`, and
`keyshard worker` exits with that one line (docs/protocol.md, TLS).
"""

from __future__ import annotations

import ssl

from keyshard.core.protocol.channel import Channel
from keyshard.core.protocol.codec import ForeignProtocol
from keyshard.core.protocol.messages import ErrorCode
from keyshard.core.security.tls import ClientTls

#: Where a coordinator listens for consumers unless told otherwise (its --listen).
DEFAULT_CONSUMER_PORT = 7171

# OpenSSL's reasons when the other end answers a ClientHello with something that is not
# TLS: a keyshard frame (a length prefix, then a version byte) is one of these.
_NOT_TLS_REASONS = {
    "WRONG_VERSION_NUMBER",
    "UNKNOWN_PROTOCOL",
    "PACKET_LENGTH_TOO_LONG",
    "RECORD_LAYER_FAILURE",
    "HTTP_REQUEST",
}
_NAME_MISMATCH = {62, 64}  # X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH


def handshake_problem(err: BaseException, tls: ClientTls | None, address: str) -> str | None:
    """Why our TLS handshake with `address` failed, when no retry can help; else None."""
    if isinstance(err, ssl.SSLCertVerificationError):
        detail = err.verify_message or err.reason or str(err)
        if err.verify_code in _NAME_MISMATCH:
            host = address.rpartition(":")[0]
            return (
                f"the coordinator's certificate at {address} is not valid for {host!r}, the "
                f"name coordinator_tls checks ({detail}); connect by a name the certificate "
                "lists"
            )
        ca = tls.ca_file if tls is not None else "the system's CAs"
        return (
            f"the coordinator's certificate at {address} is not trusted by "
            f"coordinator_tls.ca_file ({ca}): {detail}"
        )
    if isinstance(err, ssl.SSLError) and err.reason in _NOT_TLS_REASONS:
        return (
            f"the coordinator at {address} does not speak TLS on its consumer channel "
            f"(TLS handshake: {err.reason}): drop coordinator_tls, or start the coordinator "
            "with --tls-cert-file"
        )
    return None


def wrong_port_problem(channel: Channel, address: str) -> str | None:
    """Why `channel` closed, when `address` is an HTTP server (keyshard's admin API, most
    likely) rather than a coordinator's consumer port; else None."""
    if channel.peer_protocol is not ForeignProtocol.HTTP_RESPONSE:
        return None
    return (
        f"{address} answers in HTTP: it is keyshard's admin API (or another web server), "
        "not a coordinator's consumer port; consumers connect to the consumer port "
        f"({DEFAULT_CONSUMER_PORT} by default, the coordinator's --listen)"
    )


def closed_problem(channel: Channel, tls: ClientTls | None, address: str) -> str | None:
    """Why `channel` was closed before answering our request, when it points at our TLS
    settings; else None (the coordinator went away, or refused us for a reason it gave)."""
    error = channel.peer_error
    if error is not None:
        if error.code is ErrorCode.TLS_REQUIRED:
            return (
                f"the coordinator at {address} requires TLS on its consumer channel: set "
                "coordinator_tls (ClientTls with the CA file that signed its certificate)"
            )
        return None
    if tls is None or channel.heard_from_peer:
        return None
    if tls.cert_file is None:
        return (
            f"the coordinator at {address} closed the TLS connection: it may require a "
            "client certificate (coordinator_tls.cert_file)"
        )
    return (
        f"the coordinator at {address} closed the TLS connection: it may not accept our "
        f"client certificate (coordinator_tls.cert_file = {tls.cert_file}: it must be "
        "signed by the CA of the coordinator's --tls-client-ca-file)"
    )
