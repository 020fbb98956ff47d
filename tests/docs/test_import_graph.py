"""The import graph drawn on the Architecture page (docs/hooks/import_graph.py)."""

from __future__ import annotations

from docs.hooks import import_graph as graph
from tests.docs.blocks import ROOT

LAYERS = graph.Layers(
    bands=[
        ["keyshard.cli"],
        ["keyshard.coordinator", "keyshard.consumer_client"],
        ["keyshard.core"],
    ],
    inner={"keyshard.core": [["keyshard.core.protocol"], ["keyshard.core.model"]]},
)


def test_modules_collapse_into_the_rooms_of_the_code() -> None:
    assert graph.node_of("keyshard.coordinator.group.state") == "keyshard.coordinator.group"
    assert graph.node_of("keyshard.core.model") == "keyshard.core.model"
    assert graph.node_of("keyshard.consumer_client._datapath.lanes") == (
        "keyshard.consumer_client._datapath"
    )
    assert graph.node_of("keyshard.consumer_client") == "keyshard.consumer_client"
    assert graph.node_of("keyshard.cli.parser") == "keyshard.cli"
    imports = [
        ("keyshard.cli.main", "keyshard.cli.parser"),
        ("keyshard.cli.main", "keyshard.core.model.ranges"),
    ]
    assert graph.collapse(imports) == {("keyshard.cli", "keyshard.core.model")}


def test_cycles_are_found_and_only_cycles() -> None:
    edges = {("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}
    assert graph.cyclic_edges("abcd", edges) == {("a", "b"), ("b", "c"), ("c", "a")}
    assert graph.cyclic_edges("ab", {("a", "b")}) == set()


def _drawn(edges: set[tuple[str, str]]) -> tuple[str, set[tuple[str, str]]]:
    nodes = {n for edge in edges for n in edge}
    drawing = graph.place(nodes, edges, LAYERS)
    bad = graph.violations(drawing.places, edges)
    return graph.render_svg(drawing, edges, bad), bad


def test_imports_down_the_layers_are_allowed() -> None:
    edges = {
        ("keyshard.cli", "keyshard.coordinator.group"),
        ("keyshard.coordinator.group", "keyshard.core.protocol"),
        ("keyshard.core.protocol", "keyshard.core.model"),
    }
    svg, bad = _drawn(edges)
    assert bad == set()
    assert "#d62728" not in svg.split("</defs>")[1]


def test_an_upward_import_a_sideways_one_and_a_cycle_are_drawn_red() -> None:
    up = ("keyshard.core.model", "keyshard.core.protocol")
    across = ("keyshard.consumer_client._datapath", "keyshard.coordinator.group")
    cycle = {("keyshard.coordinator.group", "keyshard.coordinator.runtime"),
             ("keyshard.coordinator.runtime", "keyshard.coordinator.group")}  # fmt: skip
    svg, bad = _drawn({up, across, *cycle})
    assert bad == {up, across, *cycle}
    assert svg.count('stroke="#d62728"') == 4


def test_the_code_as_it_is_draws_no_forbidden_import() -> None:
    svg, bad = graph.build(ROOT / "pyproject.toml")
    assert bad == set()
    for room in ("keyshard.coordinator.group", "keyshard.core.model", "keyshard.cli"):
        assert f"<title>{room}</title>" in svg
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
