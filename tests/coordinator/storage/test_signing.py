"""The replica secret: a signed beat or marker verifies with any secret of the file, and
nothing else does: not unsigned, not signed with another secret, not moved to another
topic or partition, not altered."""

from __future__ import annotations

from pathlib import Path

import pytest

from keyshard.coordinator.storage.signing import (
    SIGNATURE_HEADER,
    ReplicaSecret,
    SecretError,
    key_id,
)

OLD, NEW = "old-secret-0123456789", "new-secret-0123456789"
KEY, VALUE = b"E\x000", b'{"v":3,"epoch":2,"kind":"epoch"}'


def test_a_signed_record_verifies_and_nothing_else_does() -> None:
    secret = ReplicaSecret.from_text(OLD)
    headers = secret.headers("__state", 0, KEY, VALUE)
    assert secret.failure("__state", 0, KEY, VALUE, headers) is None
    assert secret.failure("__state", 0, KEY, VALUE, None) == "is not signed"
    assert secret.failure("__state", 0, KEY, VALUE, [("other", b"x")]) == "is not signed"
    for topic, partition, key, value in (
        ("__other", 0, KEY, VALUE),
        ("__state", 1, KEY, VALUE),
        ("__state", 0, b"E\x001", VALUE),
        ("__state", 0, KEY, VALUE.replace(b"2", b"9")),
    ):
        why = secret.failure(topic, partition, key, value, headers)
        assert why == f"has a wrong signature (key {key_id(OLD.encode())})"
    forged = ReplicaSecret.from_text("a-forgers-own-secret").headers("__state", 0, KEY, VALUE)
    why = secret.failure("__state", 0, KEY, VALUE, forged)
    assert why is not None and "does not hold" in why


def test_rotation_every_secret_verifies_the_first_signs() -> None:
    old, both, new = (ReplicaSecret.from_text(t) for t in (OLD, f"{NEW}\n{OLD}\n", NEW))
    by_old = old.headers("t", 0, KEY, VALUE)
    by_both = both.headers("t", 0, KEY, VALUE)
    assert both.failure("t", 0, KEY, VALUE, by_old) is None  # step 1: old replicas still
    assert old.failure("t", 0, KEY, VALUE, by_both) is not None  # ...which is why step 1
    assert new.failure("t", 0, KEY, VALUE, by_both) is None  # signs with the new one
    assert dict(by_both)[SIGNATURE_HEADER].startswith(key_id(NEW.encode()).encode())


def test_the_secret_file_is_read_with_comments_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text(f"# rotated 2026-01\n\n  {NEW}  \n{OLD}\n")
    secret = ReplicaSecret.from_file(str(path))
    assert [k for k, _ in secret.keys] == [key_id(NEW.encode()), key_id(OLD.encode())]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "cannot read it"),
        ("# nothing\n\n", "holds no secret"),
        (f"{NEW}\nshort\n", "secret 2 is 5 characters, fewer than 16"),
    ],
)
def test_a_secret_file_that_cannot_be_used_is_named(
    tmp_path: Path, text: str | None, message: str
) -> None:
    path = tmp_path / "secret"
    if text is not None:
        path.write_text(text)
    with pytest.raises(SecretError, match=message) as info:
        ReplicaSecret.from_file(str(path))
    assert f"--replica-secret-file {path}" in str(info.value)
    assert NEW not in str(info.value)  # a secret is never in an error
