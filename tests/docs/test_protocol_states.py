"""docs/protocol.md §6.1 describes the member's state machine as the code has it: every
`MemberState` is in its table and nothing else is, and each `MemberStateMachine` method
or decision it names exists."""

from __future__ import annotations

import re

from keyshard.consumer_client._membership import state
from keyshard.consumer_client._membership.state import MemberState, MemberStateMachine
from tests.docs.blocks import ROOT


def _section() -> str:
    text = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8")
    start = text.index("### 6.1 Consumer")
    return text[start : text.index("### 6.2", start)]


def _rows() -> list[list[str]]:
    rows = [line.split(" | ") for line in _section().splitlines() if line.startswith("| ")]
    return [[cell.strip("| ") for cell in row] for row in rows[1:]]  # the header is not a row


def test_the_table_has_exactly_the_machines_states() -> None:
    named: set[str] = set()
    for row in _rows():
        for cell in (row[0], row[-1]):
            named |= set(re.findall(r"\b[A-Z]{4,}\b", cell))
    named.discard("DRAINING")  # a range's state, not the member's
    assert named == {s.name for s in MemberState}


#: What the machine answers without deciding anything: not in the table.
QUERIES = {"aside", "heard_ago", "lease_left", "claims", "state", "timeout_s"}


def test_the_section_names_every_decision_of_the_machine() -> None:
    methods = {
        name for name in vars(MemberStateMachine)
        if not name.startswith("_") and name not in QUERIES
    }  # fmt: skip
    named = set(re.findall(r"`\.?([A-Za-z_]+)`", _section()))
    assert methods - named == set()
    decisions = {"Lose", "RideThrough", "Adopted", "Fresh", "Wait", "Probe", "Expired",
                 "Apply", "Hold", "Ignore", "Refuse", "Unexpected"}  # fmt: skip
    assert decisions <= named
    assert all(isinstance(getattr(state, d), type) for d in decisions)
