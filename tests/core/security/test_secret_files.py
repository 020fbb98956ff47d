"""Secrets from a file or the environment; a plain command-line value works, with a
warning; both forms at once, or a file that cannot be used, is one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from keyshard.core.security.secret_files import SecretFileError, read_secret_file, secret_from

FLAGS = {"flag": "--auth-token", "file_flag": "--auth-token-file"}


def test_a_file_gives_its_text_without_the_trailing_newline(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("s3cret \n")
    assert secret_from(None, str(path), env_value=None, **FLAGS) == ("s3cret", None)


def test_the_environment_gives_it_quietly_and_a_command_line_value_warns() -> None:
    assert secret_from("s3cret", None, env_value="s3cret", **FLAGS) == ("s3cret", None)
    value, warning = secret_from("s3cret", None, env_value=None, **FLAGS)
    assert value == "s3cret"
    assert warning is not None and "--auth-token" in warning and "ps" in warning
    assert "--auth-token-file" in warning and "s3cret" not in warning
    assert secret_from(None, None, env_value=None, **FLAGS) == (None, None)


@pytest.mark.parametrize(
    ("content", "message"), [(None, "cannot read it"), ("\n  \n", "the file is empty")]
)
def test_a_file_that_cannot_be_used_is_named(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SecretFileError, match=f"--auth-token-file {path}: {message}"):
        read_secret_file(str(path), "--auth-token-file")


def test_both_forms_at_once_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("a")
    with pytest.raises(SecretFileError, match="--auth-token or --auth-token-file, not both"):
        secret_from("b", str(path), env_value=None, **FLAGS)
