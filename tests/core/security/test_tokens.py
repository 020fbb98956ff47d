"""Static per-principal tokens from a file: looked up by digest, errors without secrets."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from keyshard.core.security.identity import IdentityConfigError, user
from keyshard.core.security.tokens import parse_token_lines, read_token_file


def test_each_token_names_its_principal_plain_or_as_a_digest() -> None:
    digest = hashlib.sha256(b"team-b-token").hexdigest()
    table = parse_token_lines(
        "# team tokens\nUser:team-a team-a-token\n\n'User:CN=x,O=Example Corp' sha256:"
        f"{digest}  # b\n",
        "tokens",
    )
    assert len(table) == 2
    assert table.principal("team-a-token") == user("team-a")
    assert table.principal("team-b-token") == user("CN=x,O=Example Corp")
    assert table.principal("team-a-token ") is None
    assert table.principal("") is None
    assert table.principal("\ud800") is None  # no UTF-8: compared, unequal, no error
    assert "team-a-token" not in repr(table)


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("User:a", r"tokens line 1: expected '<principal> <token>'"),
        ("User:a Zq9-tok extra", r"line 1: expected .*\(3 fields\)"),
        ("alice tok", r"line 1: its first field is not a principal"),
        # Written token first: refused without repeating the token.
        ("Zq9-tok User:a", r"line 1: its first field is not a principal"),
        ("User:a sha256:abc", r"line 1: a sha256: digest is 64 hexadecimal digits"),
        ("User:a Zq9-same\nUser:b Zq9-same", r"line 2: the same token as tokens line 1"),
        ("User:a 'Zq9-open", r"line 1: unbalanced quotes"),
        # The quoting would change the token: `Zq9-a` alone would pass for `Zq9-a#b`.
        ("User:a Zq9-a#b", r"line 1: the token is not read as written"),
        ("User:a Zq9-a\\b", r"line 1: the token is not read as written"),
        ("User:a 'Zq9-a b'", r"line 1: the token is not read as written"),
        ("# nothing\n", r"tokens: no tokens in it"),
    ],
)
def test_a_malformed_file_is_refused_naming_the_line_not_its_secret(
    text: str, complaint: str
) -> None:
    with pytest.raises(IdentityConfigError, match=complaint) as caught:
        parse_token_lines(text, "tokens")
    assert "Zq9" not in str(caught.value)


def test_an_unreadable_file_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(IdentityConfigError, match=r"--auth-tokens-file .*cannot read it"):
        read_token_file(str(tmp_path / "missing"))
    path = tmp_path / "tokens"
    path.write_text("User:a tok\n")
    assert read_token_file(str(path)).principal("tok") == user("a")
