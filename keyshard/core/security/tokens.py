"""Static per-principal tokens, from a file (what a Kubernetes Secret mounted as a volume
gives): one line per principal, `<principal> <token>`, or `<principal> sha256:<hex>` so
the Secret need not hold the token itself.

A token is never kept or compared as given: its SHA-256 digest is, and a lookup compares
the digest of what a client sent with every entry's (`hmac.compare_digest`, no early
exit), so how long a lookup takes says nothing about which entry, or how much of one,
matched. Errors name the file and the line, never a line's text: that holds a secret.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass, field

from keyshard.core.security.identity import IdentityConfigError, Principal, parse_principal
from keyshard.core.security.line_files import lines_with_fields, read_line_file

_DIGEST = re.compile(r"sha256:([0-9a-fA-F]{64})")


def token_digest(token: str) -> bytes:
    # Total: a string that is no UTF-8 (a lone surrogate) hashes, it does not raise.
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


@dataclass(frozen=True, slots=True)
class TokenTable:
    """Principals by the digest of their token."""

    entries: tuple[tuple[bytes, Principal], ...] = field(repr=False)

    def principal(self, token: str) -> Principal | None:
        """Whose token `token` is, or None: every entry is compared, whatever matches."""
        given = token_digest(token)
        found: Principal | None = None
        for digest, principal in self.entries:
            if hmac.compare_digest(given, digest):
                found = principal
        return found

    def __len__(self) -> int:
        return len(self.entries)


def parse_token_lines(text: str, source: str) -> TokenTable:
    """The table a token file's text gives; `source` names it in errors."""
    entries: list[tuple[bytes, Principal]] = []
    seen: dict[bytes, str] = {}
    for where, fields, line in lines_with_fields(text, source, IdentityConfigError):
        if len(fields) != 2:
            raise IdentityConfigError(
                f"{where}: expected '<principal> <token>' or '<principal> sha256:<hex>' "
                f"({len(fields)} fields)"
            )
        try:
            principal = parse_principal(fields[0], setting=where)
        except IdentityConfigError:
            # The field is not repeated: a line written token first would show the token.
            raise IdentityConfigError(
                f"{where}: its first field is not a principal: write '<principal> <token>', "
                "the principal as Kafka does, <type>:<name> (e.g. User:alice)"
            ) from None
        if fields[1] not in line.split():
            # The quoting changed it (`a#b` reads as `a`, `a\\b` as `ab`): the token taken
            # would not be the one written, and `a` alone would pass for it.
            raise IdentityConfigError(
                f"{where}: the token is not read as written (a '#', a backslash or a quote "
                "in it): give its sha256: digest instead"
            )
        digest_hex = _DIGEST.fullmatch(fields[1])
        if digest_hex is not None:
            digest = bytes.fromhex(digest_hex.group(1))
        elif fields[1].startswith("sha256:"):
            raise IdentityConfigError(f"{where}: a sha256: digest is 64 hexadecimal digits")
        else:
            digest = token_digest(fields[1])
        if digest in seen:
            raise IdentityConfigError(
                f"{where}: the same token as {seen[digest]}: a token must name one principal"
            )
        seen[digest] = where
        entries.append((digest, principal))
    if not entries:
        raise IdentityConfigError(f"{source}: no tokens in it")
    return TokenTable(tuple(entries))


def read_token_file(path: str, flag: str = "--auth-tokens-file") -> TokenTable:
    text = read_line_file(path, flag, IdentityConfigError)
    return parse_token_lines(text, f"{flag} {path}")
