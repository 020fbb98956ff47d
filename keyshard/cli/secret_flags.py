"""The flags that carry secrets, and what limits a connection before it authenticates.

Every token has three doors, in this order of preference: a file (`--auth-token-file`:
what a Kubernetes Secret mounted as a volume gives), the environment
(`KEYSHARD_AUTH_TOKEN`), and the plain flag, which works but warns once that its value
shows in `ps` (`keyshard.core.security.secret_files`). The replica secret comes from a
file only.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping

from keyshard.cli.flag_values import env_variable
from keyshard.coordinator.server.admission import MIN_PRE_AUTH_FRAME_BYTES
from keyshard.core.protocol.codec import DEFAULT_MAX_FRAME_BYTES, PRE_AUTH_MAX_FRAME_BYTES
from keyshard.core.security.secret_files import secret_from

AddFlag = Callable[..., None]  # keyshard.cli.parser._add: a flag with its variable


def frame_bytes(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of bytes") from None
    if not MIN_PRE_AUTH_FRAME_BYTES <= number <= DEFAULT_MAX_FRAME_BYTES:
        raise argparse.ArgumentTypeError(
            f"{value!r} must be within {MIN_PRE_AUTH_FRAME_BYTES}..{DEFAULT_MAX_FRAME_BYTES} "
            "(the frame limit after Register)"
        )
    return number


def add_coordinator_secret_flags(coord: argparse.ArgumentParser, add: AddFlag) -> None:
    add(
        coord,
        "--auth-token-file",
        default=None,
        help="file holding the token consumers must present at Register (instead of --auth-token)",
    )
    add(
        coord,
        "--admin-token-file",
        default=None,
        help="file holding the admin API's bearer token (instead of --admin-token)",
    )
    add(
        coord,
        "--replica-secret-file",
        default=None,
        help="file holding the secret replicas sign their beats and epoch markers with, one "
        "a line (the first signs, every one verifies); every replica needs the same",
    )
    add(
        coord,
        "--pre-auth-max-frame-bytes",
        type=frame_bytes,
        default=PRE_AUTH_MAX_FRAME_BYTES,
        help="the largest frame a consumer connection may send before its Register succeeds",
    )


def add_token_file_flag(parser: argparse.ArgumentParser, add: AddFlag) -> None:
    """A worker's `--auth-token-file`, beside its `--auth-token`."""
    add(
        parser,
        "--auth-token-file",
        default=None,
        help="file holding the coordinator's --auth-token (instead of --auth-token)",
    )


def take_secret(
    args: argparse.Namespace,
    dest: str,
    flag: str,
    *,
    command: str,
    variable: str | None = None,
    environ: Mapping[str, str] = os.environ,
) -> str | None:
    """Resolve `--<flag>` / `--<flag>-file` into `args.<dest>` (the secret or None) and
    return it; a plain command-line value is said on stderr, once. `variable` is the
    flag's environment variable when not the usual one. A bad file raises a
    SecretFileError (a ValueError) naming the flag."""
    secret, warning = secret_from(
        getattr(args, dest),
        getattr(args, f"{dest}_file"),
        flag=flag,
        file_flag=f"{flag}-file",
        env_value=environ.get(variable or env_variable(flag)),
    )
    if warning is not None:
        print(f"keyshard {command}: warning: {warning}", file=sys.stderr)
    setattr(args, dest, secret)
    return secret


def take_coordinator_secrets(args: argparse.Namespace) -> None:
    """The coordinator's tokens, each resolved in place (see `take_secret`)."""
    take_secret(args, "auth_token", "--auth-token", command="coordinator")
    take_secret(args, "admin_token", "--admin-token", command="coordinator")
