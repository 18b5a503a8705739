"""Draws docs/architecture.png, the package's modules and their imports, from the code itself (needs matplotlib).

    python docs/architecture_figure.py [OUT.png]

Every module of ``gae_xp/`` is a box, each subpackage (``gae_xp.adapters``, ``gae_xp.bench``,
``gae_xp.distributed``, ``gae_xp.testing``, and ``gae_xp.backends``, which lives in the top-level
``backends/``) one box for all its modules; the number in a box is its lines of code. An arrow A -> B says
that A imports B (read with ``ast`` from every ``import`` statement, at module level or inside a function);
its width grows with the number of A's modules that import B. Boxes are laid out in columns, each module left of
everything it imports, so the arrows point right, except where two boxes import each other (drawn dashed).
"""

from __future__ import annotations

import argparse
import ast
import collections
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: the subpackages drawn as one box each, and the folder that holds each one's modules
PACKAGES = {"adapters": ROOT / "gae_xp" / "adapters", "bench": ROOT / "gae_xp" / "bench",
            "distributed": ROOT / "gae_xp" / "distributed", "testing": ROOT / "gae_xp" / "testing",
            "backends": ROOT / "backends"}
COLOURS = {"public": "#4C72B0", "private": "#8C8C8C", "package": "#55A868", "backends": "#C44E52"}


def modules() -> dict[str, list[pathlib.Path]]:
    """The boxes: a box's name -> the files of its modules (``gae_xp/__init__.py`` is the package's own)."""
    boxes = {path.stem: [path] for path in sorted((ROOT / "gae_xp").glob("*.py"))}
    boxes.update({name: sorted(folder.rglob("*.py")) for name, folder in PACKAGES.items()})
    return boxes


def box_of(dotted: str) -> str | None:
    """The box of an absolute module name inside gae_xp (``gae_xp.bench.cli`` -> ``bench``), else None."""
    parts = dotted.split(".")
    if parts[0] != "gae_xp":
        return "backends" if parts[0] == "backends" else None
    return parts[1] if len(parts) > 1 else "__init__"


def absolute(path: pathlib.Path, node: ast.ImportFrom) -> str:
    """The absolute name of a ``from ... import`` statement's module, in the installed package's terms."""
    if node.level == 0:
        return node.module or ""
    package = ["gae_xp", *path.parent.relative_to(ROOT / "gae_xp").parts] if ROOT / "gae_xp" in path.parents \
        else ["gae_xp", "backends", *path.parent.relative_to(ROOT / "backends").parts]
    base = package[:len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imported_boxes(path: pathlib.Path, known: set[str]) -> set[str]:
    """The boxes one file imports (``from gae_xp import reference`` imports the box ``reference``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(box_of(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = absolute(path, node)
            for alias in node.names:
                named = box_of(f"{module}.{alias.name}") if box_of(module) == "__init__" else None
                found.add(named if named in known else box_of(module))
    return found & known


def graph() -> tuple[dict[str, int], collections.Counter]:
    """(lines of code per box, the number of a box's files that import another box per (importer, imported))."""
    boxes = modules()
    lines = {name: sum(len(path.read_text(encoding="utf-8").splitlines()) for path in files)
             for name, files in boxes.items()}
    edges = collections.Counter()
    for name, files in boxes.items():
        for path in files:
            for target in imported_boxes(path, set(boxes)) - {name}:
                edges[name, target] += 1
    return lines, edges


def rows(names: list[str], edges: collections.Counter) -> list[list[str]]:
    """The boxes in rows: a box one row above the lowest of the boxes it imports (mutual imports ignored)."""
    imports = collections.defaultdict(set)
    for source, target in edges:
        if (target, source) not in edges:
            imports[source].add(target)
    depth: dict[str, int] = {}

    def level(name: str, seen: frozenset = frozenset()) -> int:
        if name not in depth:
            below = [level(t, seen | {name}) for t in imports[name] if t not in seen]
            depth[name] = 1 + max(below, default=-1)
        return depth[name]

    for name in names:
        level(name)
    layered = [[] for _ in range(max(depth.values()) + 1)]
    for name in names:
        layered[depth[name]].append(name)
    layered.reverse()  # importers at the top
    # order each row by the mean position of what it is linked to in the row above, to uncross the arrows
    for above, row in zip(layered, layered[1:]):
        place = {name: i for i, name in enumerate(above)}
        linked = {name: [place[s] for s, t in edges if t == name and s in place] for name in row}
        row.sort(key=lambda name: sum(linked[name]) / len(linked[name]) if linked[name] else len(above))
    return layered


def kind(name: str) -> str:
    if name == "backends":
        return "backends"
    if name in PACKAGES:
        return "package"
    return "private" if name.startswith("_") else "public"


def draw(out: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch

    lines, edges = graph()
    layered = rows(sorted(lines), edges)
    width, height, gap_x, gap_y = 2.2, 0.9, 1.0, 0.7
    tallest = max(len(row) for row in layered)
    centre = {}  # a row of the layering is a column here: importers on the left, what they import on the right
    for c, column in enumerate(layered):
        offset = (tallest - len(column)) * (height + gap_y) / 2
        for i, name in enumerate(column):
            centre[name] = (c * (width + gap_x) + width / 2, -(offset + i * (height + gap_y)))
    fig, ax = plt.subplots(figsize=(1.0 + len(layered) * 1.55, 2.6 + tallest * 0.95))
    for name, (x, y) in centre.items():
        ax.add_patch(FancyBboxPatch((x - width / 2, y - height / 2), width, height, boxstyle="round,pad=0.04",
                                    facecolor=COLOURS[kind(name)], edgecolor="white", linewidth=1.5, zorder=3))
        label = f"{name}/" if name in PACKAGES else f"{name}.py"
        ax.text(x, y + 0.14, label, ha="center", va="center", color="white", fontsize=8.5, fontweight="bold",
                zorder=4)
        ax.text(x, y - 0.2, f"{lines[name]:,} lines", ha="center", va="center", color="white", fontsize=7, zorder=4)
    for (source, target), count in sorted(edges.items()):
        (x0, y0), (x1, y1) = centre[source], centre[target]
        mutual = (target, source) in edges
        if x0 == x1:  # mutual imports in one column: side by side vertically
            start, end = (x0 - 0.3, y0 - height / 2), (x1 - 0.3, y1 + height / 2) if y0 > y1 else \
                (x1 - 0.3, y1 - height / 2)
        else:
            start, end = (x0 + width / 2, y0), (x1 - width / 2, y1)
        span = abs(x1 - x0) / (width + gap_x)  # columns crossed: a longer arrow bends further, away from the rest
        bend = (-0.12 if span <= 1 else -0.25) * (1 if y0 >= y1 else -1)
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=9, shrinkA=1, shrinkB=1,
                                     color="#333333", alpha=0.4, linewidth=0.5 + 0.3 * min(count, 8),
                                     linestyle="--" if mutual else "-",
                                     connectionstyle=f"arc3,rad={bend}", zorder=2))
    ax.set_xlim(-0.3, len(layered) * (width + gap_x) - gap_x + 0.3)
    ax.set_ylim(-(tallest - 1) * (height + gap_y) - 2.2 * height, 2.2 * height)
    ax.axis("off")
    ax.set_title("gae_xp's modules and their imports: an arrow A -> B says that A imports B (dashed: both ways); "
                 "drawn from the code by docs/architecture_figure.py", fontsize=10, loc="left")
    legend = [Patch(color=COLOURS["public"], label="public module"),
              Patch(color=COLOURS["private"], label="private module"),
              Patch(color=COLOURS["package"], label="subpackage (all its modules)"),
              Patch(color=COLOURS["backends"], label="gae_xp.backends (backends/)")]
    ax.legend(handles=legend, loc="upper left", fontsize=8, frameon=False, ncol=4, bbox_to_anchor=(0, 0.0))
    fig.tight_layout()
    fig.savefig(out, dpi=130)
    plt.close(fig)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python docs/architecture_figure.py",
                                     description="Draw the package's modules and their imports (matplotlib only).")
    parser.add_argument("out", nargs="?", type=pathlib.Path, default=ROOT / "docs" / "architecture.png",
                        help="the picture to write (default: docs/architecture.png)")
    out = parser.parse_args(argv).out
    draw(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
