"""Draws docs/scale.png, the layouts of docs/scale.md: ``python docs/scale_figure.py`` (needs matplotlib)."""

from __future__ import annotations

import argparse
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

RANKS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52"]
SEQUENCES = ["#8172B3", "#937860", "#DA8BC3", "#8C8C8C", "#CCB974"]
W = 4


def box(ax, x, y, w, h, color, text="", *, alpha=1.0, text_color="white", size=8, edge="white"):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor=edge, linewidth=1.2, alpha=alpha))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size, color=text_color)


def arrow(ax, start, end, color="black", style="-|>", width=1.0, rad=0.0):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=10, color=color, linewidth=width,
                                 connectionstyle=f"arc3,rad={rad}"))


def label(ax, y, title, note):
    ax.text(-1, y + 0.45, title, ha="right", va="center", fontsize=10, fontweight="bold")
    ax.text(-1, y - 0.05, note, ha="right", va="center", fontsize=7.5, color="#444444")


def main(path):
    fig, ax = plt.subplots(figsize=(13, 9.6))
    ax.set_xlim(-13.5, 33)
    ax.set_ylim(-1.2, 23)
    ax.axis("off")
    length = 32  # drawing units of the time axis

    # 1. packed sequences (THD): one row, offsets cu_seqlens
    y = 21
    label(ax, y, "packed (THD)", "one row, cu_seqlens; every end cuts")
    cuts = [0, 7, 9, 20, 26, 32]
    for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
        box(ax, a, y, b - a, 0.9, SEQUENCES[i], f"seq {i}")
        ax.text(a, y - 0.35, str(a * 100), ha="center", fontsize=7)  # docs/scale.md's cu_seqlens
        if i < len(cuts) - 2:
            ax.plot([b, b], [y - 0.1, y + 1.0], color="black", linewidth=2.5)
    ax.text(32, y - 0.35, "3200", ha="center", fontsize=7)
    ax.text(16, y + 1.25, "one scan over the row: each sequence end cuts both chains and takes its bootstrap value",
            ha="center", fontsize=8)

    # 2. context parallelism, contiguous
    y = 17.6
    label(ax, y, "CP contiguous", "rank k holds piece k of W")
    for k in range(W):
        box(ax, k * length / W, y, length / W, 0.9, RANKS[k], f"rank {k}")
    for k in range(W - 1, 0, -1):
        arrow(ax, ((k + 0.5) * length / W, y + 1.05), ((k - 0.5) * length / W + 2.5, y + 1.05), color="#333333",
              rad=0.25)
    ax.text(16, y + 2.25, "what crosses between pieces: 5 numbers per row (value, on_value, edge, on_bootstrap, "
            "product), right to left", ha="center", fontsize=8)

    # 3. context parallelism, zigzag: the sequence and each rank's local shard
    y = 13.4
    label(ax, y + 0.6, "CP zigzag", "2W pieces; rank k: pieces k, 2W-1-k")
    order = list(range(W)) + list(reversed(range(W)))
    piece = length / (2 * W)
    for j, k in enumerate(order):
        box(ax, j * piece, y + 1.1, piece, 0.8, RANKS[k], f"p{j}\nr{k}", size=7)
    for k in range(W):
        x0 = k * 8.2
        box(ax, x0, y - 0.6, piece, 0.8, RANKS[k], f"p{k}", size=7)
        box(ax, x0 + piece, y - 0.6, piece, 0.8, RANKS[k], f"p{2 * W - 1 - k}", size=7, alpha=0.7)
        ax.text(x0 + piece, y - 1.0, f"rank {k}'s shard", ha="center", fontsize=7)
    ax.text(16, y + 2.2, "each rank summarises its 2 pieces; the chain runs over all 2W pieces in time order",
            ha="center", fontsize=8)

    # 4. packed + zigzag (Megatron THD with CP)
    y = 9.2
    label(ax, y, "packed + CP zigzag", "every sequence in 2W pieces")
    seq_cuts = [0, 8, 24, 32]
    for i, (a, b) in enumerate(zip(seq_cuts[:-1], seq_cuts[1:])):
        c = (b - a) / (2 * W)
        for j, k in enumerate(order):
            box(ax, a + j * c, y, c, 0.9, RANKS[k], f"{k}" if c >= 1 else "", size=7, edge=SEQUENCES[i])
        ax.plot([b, b], [y - 0.15, y + 1.05], color="black", linewidth=2.5)
        ax.text((a + b) / 2, y - 0.4, f"sequence {i}", ha="center", fontsize=7)
    ax.text(16, y + 1.25, "rank k holds pieces k and 2W-1-k of every sequence; the chains run per sequence, batched",
            ha="center", fontsize=8)

    # 5. Dask blocks and the graph
    y = 3.6
    label(ax, y + 1.2, "Dask", "blocks along time (and batch)")
    blocks = 6
    width = length / blocks
    for row in range(2):
        for j in range(blocks):
            box(ax, j * width, y + 1.0 + row * 1.0, width, 0.9, "#4C72B0" if row == 0 else "#64B5CD",
                f"block ({row},{j})", size=7)
    for j in range(blocks):
        cx = j * width + width / 2
        box(ax, cx - 1.2, y - 0.6, 2.4, 0.7, "#F2F2F2", "summary", text_color="black", size=7, edge="#999999")
        arrow(ax, (cx, y + 1.0), (cx, y + 0.12))
        box(ax, cx - 1.2, y - 2.2, 2.4, 0.7, "#F2F2F2", "fix-up", text_color="black", size=7, edge="#999999")
        arrow(ax, (cx, y - 0.62), (cx, y - 1.48), color="#999999", style="-")
        if j < blocks - 1:
            arrow(ax, (cx + width - 1.2, y - 1.0), (cx + 1.3, y - 1.0), color="#C44E52")
    ax.text(width * (blocks - 1) + width / 2 + 1.6, y - 1.0, "link", fontsize=7, color="#C44E52", va="center")
    ax.text(16, y + 3.2, "per block: a summary task, one small link task (last block first), a fix-up task: "
            "tasks grow with blocks, not with T", ha="center", fontsize=8)

    # legend for the ranks
    for k in range(W):
        box(ax, 20 + k * 3.1, -1.1, 0.6, 0.5, RANKS[k])
        ax.text(20.8 + k * 3.1, -0.85, f"rank {k}", va="center", fontsize=8)
    fig.savefig(path, dpi=110, bbox_inches="tight")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python docs/scale_figure.py", description=__doc__.partition("\n")[0])
    parser.add_argument("out", nargs="?", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "scale.png"),
                        help="the picture to write (default: docs/scale.png)")
    main(parser.parse_args().out)
