"""The import graph of package `keyshard`, drawn from the code when the docs are built.

A MkDocs hook (mkdocs.yml `hooks:`): `on_files` adds `architecture/import-graph.svg` to the
site, so the picture on the Architecture page is always the code's, never a drawing that
drifts. No external binary: the layout is a fixed grid and the SVG is written here.

Nodes are the rooms of the code: for `keyshard.coordinator`, `keyshard.consumer_client` and
`keyshard.core`, each subpackage or module one level below them (`keyshard.coordinator.group`,
`keyshard.core.model`, ...); every other package of `keyshard` is one node. An edge is an
import between two nodes (grimp, the graph import-linter checks).

Rows are the layers of the import-linter contracts in pyproject.toml, the only place the
layer rule is written: the top contract's layers are bands, a package with a layers
contract of its own is drawn with those layers as rows inside its box, and a package
without one is drawn in rows of its own import order. An edge is allowed when it runs
down the layers; one that runs up, or between two independent packages of one layer, or
that is part of a cycle, is drawn red and reported as a warning, which fails
`mkdocs build --strict`.
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

ROOT_PACKAGE = "keyshard"
#: Packages drawn one level finer: their subpackages and modules are the nodes.
SPLIT = ("keyshard.coordinator", "keyshard.consumer_client", "keyshard.core")
SVG_PATH = "architecture/import-graph.svg"

log = logging.getLogger("mkdocs.hooks.import_graph")

NODE_W, NODE_H = 164, 26
NODE_GAP, ROW_GAP = 14, 30
BOX_PAD, BOX_TITLE = 12, 22
BAND_GAP, BAND_LABEL_W, MARGIN = 22, 190, 16


# ---- the graph --------------------------------------------------------------------------


def node_of(module: str) -> str:
    """The node a module is drawn in: `keyshard.coordinator.group.state` ->
    `keyshard.coordinator.group`, `keyshard.cli.parser` -> `keyshard.cli`."""
    parts = module.split(".")
    for split in SPLIT:
        depth = split.count(".") + 1
        if module == split or module.startswith(split + "."):
            return ".".join(parts[: depth + 1])
    return ".".join(parts[:2])


def collapse(imports: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
    """Module imports -> node imports, without an edge from a node to itself."""
    edges = {(node_of(a), node_of(b)) for a, b in imports}
    return {(a, b) for a, b in edges if a != b}


def module_imports(package: str = ROOT_PACKAGE) -> list[tuple[str, str]]:
    """Every (importer, imported) pair inside `package`, as grimp sees the code."""
    import grimp

    graph = grimp.build_graph(package)
    return [
        (importer, imported)
        for importer in graph.modules
        for imported in graph.find_modules_directly_imported_by(importer)
    ]


def cyclic_edges(nodes: Iterable[str], edges: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """Edges inside a strongly connected component of more than one node (Tarjan)."""
    successors: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in edges:
        successors.setdefault(a, []).append(b)
        successors.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    component: dict[str, int] = {}

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in successors[node]:
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component[member] = index[node]
                if member == node:
                    break

    for node in successors:
        if node not in index:
            visit(node)
    sizes: dict[int, int] = {}
    for comp in component.values():
        sizes[comp] = sizes.get(comp, 0) + 1
    return {(a, b) for a, b in edges if component[a] == component[b] and sizes[component[a]] > 1}


# ---- the layers -------------------------------------------------------------------------


@dataclass
class Layers:
    """The import-linter contracts of type `layers`, read from pyproject.toml: `bands` is
    the top contract (containing `ROOT_PACKAGE`'s direct subpackages), `inner` the
    contracts of single packages below it, each a list of rows of module names."""

    bands: list[list[str]]
    inner: dict[str, list[list[str]]] = field(default_factory=dict)


def read_layers(pyproject: Path) -> Layers:
    config = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    # A contract with `containers` names its layers relative to each container.
    layered = [
        [
            [f"{container}{name.strip()}" for name in layer.split("|")]
            for layer in contract["layers"]
        ]
        for contract in contracts
        if contract.get("type") == "layers"
        for container in [f"{c}." for c in contract.get("containers", [])] or [""]
    ]
    top = next(rows for rows in layered if all(n.count(".") == 1 for r in rows for n in r))
    inner: dict[str, list[list[str]]] = {}
    for rows in layered:
        if rows is top:
            continue
        parents = {n.rsplit(".", 1)[0] for r in rows for n in r}
        (parent,) = parents
        inner[parent] = rows
    return Layers(bands=top, inner=inner)


def top_package(node: str) -> str:
    return ".".join(node.split(".")[:2])


def import_order_rows(nodes: list[str], edges: set[tuple[str, str]]) -> list[list[str]]:
    """Rows for a package without a layers contract: each node one row below the lowest
    of its importers inside the package (longest path from the top), so imports point down
    wherever the package has no cycle."""
    inside = {(a, b) for a, b in edges if a in nodes and b in nodes}
    depth = {n: 0 for n in nodes}
    for _ in nodes:  # longest path in at most len(nodes) relaxations; a cycle stops there
        for a, b in inside:
            depth[b] = max(depth[b], depth[a] + 1)
    depth = {n: min(d, len(nodes) - 1) for n, d in depth.items()}
    rows: list[list[str]] = [[] for _ in range(max(depth.values(), default=0) + 1)]
    for node in sorted(nodes):
        rows[depth[node]].append(node)
    return [row for row in rows if row]


# ---- the placement ----------------------------------------------------------------------


@dataclass(frozen=True)
class Place:
    """Where a node sits: its band, its rank (a global row number, top 0) and its box."""

    band: int
    package: str
    row: int  # row inside its package, by the package's contract (or import order)
    contracted: bool  # whether `row` comes from a layers contract
    x: float
    y: float


@dataclass
class Drawing:
    width: float
    height: float
    places: dict[str, Place]
    boxes: list[tuple[str, float, float, float, float]]  # package, x, y, w, h
    band_labels: list[tuple[str, float, float]]  # text, y top, height


def place(nodes: set[str], edges: set[tuple[str, str]], layers: Layers) -> Drawing:
    """A grid: bands top to bottom, packages of a band side by side, rows inside them."""
    by_package: dict[str, list[str]] = {}
    for node in nodes:
        by_package.setdefault(top_package(node), []).append(node)
    # Entry points outside every contract (`keyshard.__main__`) go above all layers.
    unplaced = set(by_package) - {p for band in layers.bands for p in band}
    bands = ([sorted(unplaced)] if unplaced else []) + [list(band) for band in layers.bands]

    def rows_of(package: str) -> tuple[list[list[str]], bool]:
        members = sorted(by_package.get(package, []))
        contract = layers.inner.get(package)
        if contract is None:
            return import_order_rows(members, edges), False
        rows = [[n for n in members if n in row] for row in contract]
        loose = [n for n in members if all(n not in row for row in contract)]
        return ([loose] if loose else []) + [r for r in rows if r], True

    places: dict[str, Place] = {}
    boxes: list[tuple[str, float, float, float, float]] = []
    labels: list[tuple[str, float, float]] = []
    y: float = MARGIN
    width = 0.0
    for band_index, band in enumerate(bands):
        # Bands of one lone package alternate sides, so an import that skips a band does
        # not run behind the node of the band in between.
        lone = len(band) == 1 and len(by_package.get(band[0], [])) == 1
        x: float = MARGIN + BAND_LABEL_W + (band_index % 2) * (NODE_W + 4 * NODE_GAP) * lone
        band_height = 0.0
        for package in band:
            rows, contracted = rows_of(package)
            if not rows:
                continue
            cols = max(len(r) for r in rows)
            w = cols * NODE_W + (cols - 1) * NODE_GAP + 2 * BOX_PAD
            h = BOX_TITLE + len(rows) * NODE_H + (len(rows) - 1) * ROW_GAP + 2 * BOX_PAD
            for r, row in enumerate(rows):
                row_w = len(row) * NODE_W + (len(row) - 1) * NODE_GAP
                nx = x + (w - row_w) / 2
                ny = y + BOX_TITLE + BOX_PAD + r * (NODE_H + ROW_GAP)
                for i, node in enumerate(row):
                    places[node] = Place(
                        band_index, package, r, contracted, nx + i * (NODE_W + NODE_GAP), ny
                    )
            if rows != [[package]]:
                boxes.append((package, x, y, w, h))
            x += w + 2 * NODE_GAP
            band_height = max(band_height, h)
        labels.append((" | ".join(band), y, band_height))
        width = max(width, x)
        y += band_height + BAND_GAP
    return Drawing(width + MARGIN, y - BAND_GAP + MARGIN, places, boxes, labels)


def violations(places: dict[str, Place], edges: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """Edges the contracts forbid, plus every edge of a cycle."""
    return cyclic_edges(places, edges) | {
        (a, b) for a, b in edges if _forbidden(a, places[a], places[b])
    }


def _forbidden(importer: str, a: Place, b: Place) -> bool:
    """Up a band; across two independent packages of one band; or, inside a package with
    a layers contract, sideways or up its rows. A package's own `__init__` (drawn above
    its contracted rows) may import them."""
    if a.band != b.band:
        return a.band > b.band
    if a.package != b.package:
        return True
    own_init = importer == a.package and a.row == 0 and b.row > 0
    return a.contracted and a.row >= b.row and not own_init


# ---- the SVG ----------------------------------------------------------------------------


def label(node: str, package: str) -> str:
    return node if node == package else node[len(package) + 1 :]


def render_svg(drawing: Drawing, edges: set[tuple[str, str]], bad: set[tuple[str, str]]) -> str:
    out: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{drawing.width:.0f}" '
        f'height="{drawing.height:.0f}" viewBox="0 0 {drawing.width:.0f} '
        f'{drawing.height:.0f}" font-family="sans-serif" font-size="12">',
        "<title>keyshard import graph: packages as boxes, layers as rows</title>",
        "<defs>",
        '<marker id="down" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'fill="#6b7b8c"/></marker>',
        '<marker id="bad" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" '
        'markerHeight="8" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'fill="#d62728"/></marker>',
        "</defs>",
        '<rect width="100%" height="100%" fill="#ffffff"/>',
    ]
    for text, top, height in drawing.band_labels:
        out.append(
            f'<rect x="{MARGIN / 2:.0f}" y="{top - BAND_GAP / 3:.0f}" '
            f'width="{drawing.width - MARGIN:.0f}" height="{height + 2 * BAND_GAP / 3:.0f}" '
            'fill="#f4f6f8" rx="6"/>'
        )
        for i, name in enumerate(text.split(" | ")):
            out.append(
                f'<text x="{MARGIN:.0f}" y="{top + 16 + 15 * i:.0f}" fill="#44505c" '
                f'font-weight="bold">{escape(name)}{" |" if i < text.count("|") else ""}</text>'
            )
    for package, x, y, w, h in drawing.boxes:
        out.append(
            f'<rect x="{x:.0f}" y="{y:.0f}" width="{w:.0f}" height="{h:.0f}" rx="6" '
            'fill="#ffffff" stroke="#9aa7b4"/>'
            f'<text x="{x + 8:.0f}" y="{y + 15:.0f}" fill="#44505c">{escape(package)}</text>'
        )
    ports = _ports(drawing.places, edges)
    for a, b in sorted(edges, key=lambda e: e in bad):
        out.append(
            _edge(drawing.places[a], drawing.places[b], ports[a, b], f"{a} -> {b}", (a, b) in bad)
        )
    for node, p in sorted(drawing.places.items()):
        out.append(
            f'<g><title>{escape(node)}</title><rect x="{p.x:.0f}" y="{p.y:.0f}" '
            f'width="{NODE_W}" height="{NODE_H}" rx="4" fill="#dbe8f5" stroke="#4a6f94"/>'
            f'<text x="{p.x + NODE_W / 2:.0f}" y="{p.y + NODE_H / 2 + 4:.0f}" '
            f'text-anchor="middle" fill="#1d2b38">{escape(label(node, p.package))}</text></g>'
        )
    legend_y = drawing.height - 6
    out.append(
        f'<text x="{MARGIN:.0f}" y="{legend_y:.0f}" fill="#44505c" font-size="11">'
        "grey: an import down the layers; red: an import the contracts forbid, or a cycle"
        "</text>"
    )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _ports(
    places: dict[str, Place], edges: set[tuple[str, str]]
) -> dict[tuple[str, str], tuple[float, float]]:
    """Where each edge leaves its importer and enters the imported node, as fractions of
    the node's width: a node's edges spread along its side in the order of the nodes at
    their other ends, so a bundle of imports reads as separate lines."""
    outgoing: dict[str, list[tuple[str, str]]] = {}
    incoming: dict[str, list[tuple[str, str]]] = {}
    for a, b in edges:
        outgoing.setdefault(a, []).append((a, b))
        incoming.setdefault(b, []).append((a, b))
    start: dict[tuple[str, str], float] = {}
    end: dict[tuple[str, str], float] = {}
    for group, other, into in ((outgoing, 1, start), (incoming, 0, end)):
        for group_edges in group.values():
            group_edges.sort(key=lambda e: (places[e[other]].x, places[e[other]].y))
            for i, edge in enumerate(group_edges):
                into[edge] = (i + 1) / (len(group_edges) + 1)
    return {e: (start[e], end[e]) for e in edges}


def _edge(a: Place, b: Place, port: tuple[float, float], title: str, bad: bool) -> str:
    """A curve from the bottom of the importer to the top of the imported node (or from
    side to side within one row)."""
    if a.y == b.y:
        left = a.x < b.x
        x1 = a.x + (NODE_W if left else 0)
        x2 = b.x + (0 if left else NODE_W)
        y1 = y2 = a.y + NODE_H / 2
        c1 = c2 = f"{(x1 + x2) / 2:.0f},{y1 - 24:.0f}"
    else:
        down = a.y < b.y
        x1, x2 = a.x + NODE_W * port[0], b.x + NODE_W * port[1]
        y1 = a.y + (NODE_H if down else 0)
        y2 = b.y + (0 if down else NODE_H)
        bend = (y2 - y1) / 2
        c1 = f"{x1:.0f},{y1 + bend:.0f}"
        c2 = f"{x2:.0f},{y2 - bend:.0f}"
    colour, width, marker = ("#d62728", 2, "bad") if bad else ("#6b7b8c", 1, "down")
    return (
        f'<path d="M{x1:.0f},{y1:.0f} C{c1} {c2} {x2:.0f},{y2:.0f}" fill="none" '
        f'stroke="{colour}" stroke-width="{width}" stroke-opacity="{1 if bad else 0.55}" '
        f'marker-end="url(#{marker})"><title>{escape(title)}</title></path>'
    )


# ---- the hook ---------------------------------------------------------------------------


def build(pyproject: Path) -> tuple[str, set[tuple[str, str]]]:
    """The SVG of the code as it is, and the edges the contracts forbid."""
    imports = module_imports()
    edges = collapse(imports)
    nodes = {n for edge in edges for n in edge}
    drawing = place(nodes, edges, read_layers(pyproject))
    bad = violations(drawing.places, edges)
    return render_svg(drawing, edges, bad), bad


def on_files(files: Any, config: Any) -> Any:
    """MkDocs event: add the generated SVG to the site's files."""
    from mkdocs.structure.files import File

    pyproject = Path(config["config_file_path"]).parent / "pyproject.toml"
    svg, bad = build(pyproject)
    for a, b in sorted(bad):
        log.warning("import graph: %s imports %s against the layer contracts", a, b)
    files.append(File.generated(config, SVG_PATH, content=svg))
    return files
