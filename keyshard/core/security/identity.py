"""Who a connection is: a principal, in Kafka's form (`User:alice`), and the rules that
turn a client certificate's subject into one.

Platform teams already name their clients for Kafka: ACLs are granted to `User:<name>`,
and a TLS client's name comes from its certificate subject through the broker's
`ssl.principal.mapping.rules`. The same names and the same rules here mean one ACL
grants a team its groups on the cluster and on the coordinator alike.

The subject is rendered as Java's `X500Principal.getName()` does (RFC 2253: the most
specific RDN first, `CN=alice,OU=team-a,O=Example`), because that is the string Kafka's
rules are written against. Attribute types without an RFC 2253 keyword are named as
Python's `ssl` names them (`emailAddress=...`), where Java writes an OID and hex: a rule
that matches on one of those must be written for this form.

Nothing here does I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


class IdentityConfigError(ValueError):
    """A principal or a mapping rule that cannot be used, said in one line."""


@dataclass(frozen=True, slots=True, order=True)
class Principal:
    """A Kafka principal: its type (`User`) and name, shown as `User:alice`."""

    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"


#: What a connection is when nothing authenticates it (Kafka's PLAINTEXT principal).
ANONYMOUS = Principal("User", "ANONYMOUS")


def user(name: str) -> Principal:
    return Principal("User", name)


def parse_principal(text: str, *, setting: str = "principal") -> Principal:
    """`User:alice` as a Principal; anything without a type and a name is an error
    naming `setting`."""
    kind, colon, name = text.strip().partition(":")
    if not colon or not kind or not name:
        raise IdentityConfigError(
            f"{setting}: {text!r} is not a principal: write it as Kafka does, <type>:<name> "
            "(e.g. User:alice)"
        )
    return Principal(kind, name)


# ---- a certificate subject as Kafka sees it ----------------------------------------------

#: RFC 2253's keywords for the attribute types Python's `ssl` reports by long name.
_RFC2253_KEYWORDS = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}
_ESCAPED = set(',+"\\<>;')

#: A certificate subject as `ssl.SSLSocket.getpeercert()` gives it: RDNs, each a tuple of
#: (attribute type, value) pairs, in the certificate's order (least specific first).
Subject = Sequence[Sequence[tuple[str, str]]]


def distinguished_name(subject: Subject) -> str:
    """The subject as RFC 2253 text, most specific RDN first (`CN=alice,O=Example`)."""
    rdns = []
    for rdn in reversed(subject):
        rdns.append("+".join(f"{_RFC2253_KEYWORDS.get(k, k)}={_escape(v)}" for k, v in rdn))
    return ",".join(rdns)


def _escape(value: str) -> str:
    out = "".join(f"\\{c}" if c in _ESCAPED else c for c in value)
    if out.startswith(("#", " ")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out


def subject_of(peercert: dict[str, Any] | None) -> Subject | None:
    """The subject of a verified peer certificate (`getpeercert()`), or None."""
    if not peercert:
        return None
    subject = peercert.get("subject")
    return subject if subject else None


# ---- ssl.principal.mapping.rules -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Rule:
    pattern: re.Pattern[str] | None  # None: DEFAULT (the whole DN)
    replacement: str = ""
    case: str = ""  # "L", "U" or ""

    def apply(self, dn: str) -> str | None:
        if self.pattern is None:
            return dn
        if self.pattern.fullmatch(dn) is None:
            return None
        # As Java's replaceAll after a whole match: an empty match at the end also counts.
        name = self.pattern.sub(_java_replacement(self.replacement, self.pattern.groups), dn)
        return name.lower() if self.case == "L" else name.upper() if self.case == "U" else name

    def __str__(self) -> str:
        if self.pattern is None:
            return "DEFAULT"
        return f"RULE:{self.pattern.pattern}/{self.replacement}/{self.case}"


class PrincipalMapper:
    """Kafka's `ssl.principal.mapping.rules`: `RULE:pattern/replacement/[LU]` and
    `DEFAULT`, comma-separated, tried in order; the first rule whose pattern matches the
    whole DN names the user. `$1` in a replacement is the pattern's first group; a
    group the pattern does not have stays literal text."""

    def __init__(self, rules: str = "DEFAULT") -> None:
        self.rules = _parse_rules(rules)
        self.text = rules

    def principal(self, dn: str) -> Principal:
        for rule in self.rules:
            name = rule.apply(dn)
            if name is not None:
                if not name:
                    raise IdentityConfigError(
                        f"the mapping rule {rule} turns the subject {dn!r} into an empty name"
                    )
                return user(name)
        raise IdentityConfigError(
            f"no principal mapping rule applies to the certificate subject {dn!r} "
            f"(rules: {self.text})"
        )


def _parse_rules(text: str) -> tuple[_Rule, ...]:
    rules: list[_Rule] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            break
        if text.startswith("DEFAULT", i):
            rules.append(_Rule(None))
            i += len("DEFAULT")
        elif text.startswith("RULE:", i):
            start = i
            pattern, i = _until_slash(text, i + len("RULE:"), start)
            replacement, i = _until_slash(text, i, start)
            case = ""
            if i < n and text[i] in "LU":
                case, i = text[i], i + 1
            try:
                compiled = re.compile(pattern)
            except re.error as err:
                raise IdentityConfigError(
                    f"principal mapping rule {text[start:i]!r}: its pattern is no regular "
                    f"expression ({err})"
                ) from None
            rules.append(_Rule(compiled, replacement, case))
        else:
            raise IdentityConfigError(
                f"principal mapping rules: {text[i:]!r} is not a rule (write "
                "RULE:pattern/replacement/[LU] or DEFAULT, separated by commas)"
            )
        while i < n and text[i].isspace():
            i += 1
        if i < n:
            if text[i] != ",":
                raise IdentityConfigError(
                    f"principal mapping rules: unexpected {text[i:]!r} after a rule "
                    "(rules are separated by commas)"
                )
            i += 1
    if not rules:
        raise IdentityConfigError("principal mapping rules: none given (DEFAULT is the default)")
    return tuple(rules)


def _until_slash(text: str, i: int, start: int) -> tuple[str, int]:
    """The text from `i` to the next unescaped `/` (kept escaped), and the index after it."""
    out: list[str] = []
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            out.append(text[i : i + 2])
            i += 2
            continue
        if c == "/":
            return "".join(out), i + 1
        out.append(c)
        i += 1
    raise IdentityConfigError(
        f"principal mapping rule {text[start:]!r}: a rule is RULE:pattern/replacement/[LU] "
        "(a '/' is missing)"
    )


def _java_replacement(replacement: str, groups: int) -> Callable[[re.Match[str]], str]:
    """A Java `replaceAll` replacement as a function of the match: `$n` is group n (the
    longest number that names a group), `\\c` is `c`."""

    def expand(match: re.Match[str]) -> str:
        out: list[str] = []
        i, n = 0, len(replacement)
        while i < n:
            c = replacement[i]
            if c == "\\" and i + 1 < n:
                out.append(replacement[i + 1])
                i += 2
            elif c == "$" and i + 1 < n and replacement[i + 1].isdigit():
                j = i + 1
                number = int(replacement[j])
                j += 1
                while (
                    j < n
                    and replacement[j].isdigit()
                    and number * 10 + int(replacement[j]) <= groups
                ):
                    number = number * 10 + int(replacement[j])
                    j += 1
                if number > groups:
                    out.append(replacement[i:j])
                else:
                    out.append(match.group(number) or "")
                i = j
            else:
                out.append(c)
                i += 1
        return "".join(out)

    return expand
