"""The TLS files of keyshard's own endpoints, from the `coordinator` command's flags.

Checked before anything starts (no embedded broker, no socket): a missing file, a key
that does not match its certificate or a wrong password is one line naming the flag and
exit status 2, not a traceback from deep inside the daemon. Key passwords come from the
environment only: a flag's value shows in `ps`.
"""

from __future__ import annotations

import argparse
import os

from keyshard.core.security.tls import ServerTls, TlsConfigError, TlsNames

CHANNEL_NAMES = TlsNames(
    ca="--tls-client-ca-file",
    cert="--tls-cert-file",
    key="--tls-key-file",
    key_password="KEYSHARD_TLS_KEY_PASSWORD",
)
ADMIN_NAMES = TlsNames(
    ca="(no client CA on the admin API)",
    cert="--admin-tls-cert-file",
    key="--admin-tls-key-file",
    key_password="KEYSHARD_ADMIN_TLS_KEY_PASSWORD",
)


def endpoint_tls(args: argparse.Namespace) -> tuple[ServerTls | None, ServerTls | None]:
    """(consumer channel, admin API) TLS settings, each None when off; raises
    `TlsConfigError` naming the flag when a file is unusable."""
    channel = admin = None
    if args.tls_cert_file:
        channel = ServerTls(
            cert_file=args.tls_cert_file,
            key_file=args.tls_key_file,
            client_ca_file=args.tls_client_ca_file,
            key_password=os.environ.get(CHANNEL_NAMES.key_password),
            names=CHANNEL_NAMES,
        )
    elif args.tls_key_file or args.tls_client_ca_file:
        given = "--tls-key-file" if args.tls_key_file else "--tls-client-ca-file"
        raise TlsConfigError(f"{given} needs --tls-cert-file (TLS on the consumer channel)")
    if args.admin_tls_cert_file:
        admin = ServerTls(
            cert_file=args.admin_tls_cert_file,
            key_file=args.admin_tls_key_file,
            key_password=os.environ.get(ADMIN_NAMES.key_password),
            names=ADMIN_NAMES,
        )
    elif args.admin_tls_key_file:
        raise TlsConfigError("--admin-tls-key-file needs --admin-tls-cert-file (HTTPS)")
    for tls in (channel, admin):
        if tls is not None:
            tls.context()  # raises with the flag's name
    return channel, admin
