"""The daemon's pure helpers (the daemon itself runs in the integration tests)."""

from __future__ import annotations

import pytest

from keyshard.daemon import admin_url


@pytest.mark.parametrize(
    ("advertised", "expected"),
    [
        ("10.0.0.5:7171", "http://10.0.0.5:7172"),
        ("coord-0.example:7171", "http://coord-0.example:7172"),
        ("fd00::5:7171", "http://[fd00::5]:7172"),
        ("[fd00::5]:7171", "http://[fd00::5]:7172"),
    ],
)
def test_the_admin_url_of_a_replica_is_a_valid_url(advertised: str, expected: str) -> None:
    assert admin_url(advertised, 7172, https=False) == expected
    assert admin_url(advertised, 7172, https=True) == expected.replace("http:", "https:")
