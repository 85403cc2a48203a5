"""Draw the data-flow picture of each tile collective into docs/_static/collectives/*.png.

The pictures are committed; run this again after changing an algorithm:

    python docs/make_figures.py

Every picture shows four ranks side by side. A coloured square is one tile, coloured by the rank
whose data it holds (several colours: a sum of those ranks' tiles); arrows are remote accesses,
numbered by step where the order matters.
"""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Rectangle

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_static", "collectives")
W = 4
COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52"]
X0, DX = 0.8, 2.2  # x of rank 0's column, distance between columns


def rank_x(r: int) -> float:
    return X0 + r * DX


def new_figure(title: str, rows: list[str], height: float = 3.6):
    fig, ax = plt.subplots(figsize=(9.5, height))
    ax.set_xlim(-1.5, X0 + (W - 1) * DX + 1.6)
    ax.set_ylim(-0.3, len(rows) * 1.3 + 0.5)
    ax.axis("off")
    ax.set_title(title, fontsize=12, loc="left")
    for r in range(W):
        ax.text(rank_x(r) + 0.35, len(rows) * 1.3 + 0.15, f"rank {r}", ha="center", fontsize=10, weight="bold")
    for i, label in enumerate(rows):
        ax.text(-1.45, row_y(rows, i) + 0.3, label, ha="left", va="center", fontsize=9, color="#444")
    return fig, ax


def row_y(rows: list[str], i: int) -> float:
    return (len(rows) - 1 - i) * 1.3 + 0.1


def tile(ax, x: float, y: float, owners, size: float = 0.7, hatch=None, label=None):
    """A tile at (x, y) holding data of ``owners`` (stripes, one per rank summed in)."""
    owners = list(owners) or [None]
    width = size / len(owners)
    for k, owner in enumerate(owners):
        color = "#eeeeee" if owner is None else COLORS[owner]
        ax.add_patch(Rectangle((x + k * width, y), width, size, facecolor=color, edgecolor="none", hatch=hatch))
    ax.add_patch(Rectangle((x, y), size, size, facecolor="none", edgecolor="#333", linewidth=1))
    if label:
        ax.text(x + size / 2, y - 0.12, label, ha="center", va="top", fontsize=7, color="#333")


def arrow(ax, start, end, color="#555", step=None, rad=0.0, style="-|>", lw=1.1):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=9, color=color, linewidth=lw,
                                 connectionstyle=f"arc3,rad={rad}", shrinkA=2, shrinkB=2))
    if step is not None:
        mx, my = (start[0] + end[0]) / 2, (start[1] + end[1]) / 2
        ax.text(mx, my, str(step), fontsize=7, ha="center", va="center",
                bbox={"boxstyle": "circle,pad=0.15", "fc": "white", "ec": color, "lw": 0.8})


def save(fig, name: str, caption: str) -> None:
    fig.text(0.01, 0.01, caption, fontsize=8.5, color="#333", ha="left", va="bottom", wrap=True)
    os.makedirs(OUT, exist_ok=True)
    fig.savefig(os.path.join(OUT, f"{name}.png"), dpi=110, bbox_inches="tight")
    plt.close(fig)


def top(y):
    return y + 0.7


def centre(x):
    return x + 0.35


# --- the all-reduce family --------------------------------------------------------------------

def all_reduce_atomic() -> None:
    rows = ["tile (registers)", "dst"]
    fig, ax = new_figure("all_reduce_atomic: every rank adds its tile into every rank's dst", rows)
    ys, yd = row_y(rows, 0), row_y(rows, 1)
    for r in range(W):
        tile(ax, rank_x(r), ys, [r])
        tile(ax, rank_x(r), yd, range(W), label="zeroed, then sum")
    for src in range(W):
        for dst in range(W):
            arrow(ax, (centre(rank_x(src)), ys), (centre(rank_x(dst)), top(yd)), color=COLORS[src], lw=0.9)
    save(fig, "all_reduce_atomic", "One atomic_add per element to each rank (W x W arrows). Needs a zeroed dst; "
         "complete when every rank's kernel has returned (or a barrier).")


def all_reduce_spinlock() -> None:
    rows = ["tile (registers)", "lock + dst"]
    fig, ax = new_figure("all_reduce_spinlock: lock the tile at each rank, read-add-write, unlock", rows)
    ys, yd = row_y(rows, 0), row_y(rows, 1)
    for r in range(W):
        tile(ax, rank_x(r), ys, [r])
        tile(ax, rank_x(r), yd, range(W), label="lock per tile")
        ax.text(rank_x(r) + 0.85, yd + 0.55, "lock", fontsize=7, color="#333")
    for src in range(W):
        for dst in range(W):
            arrow(ax, (centre(rank_x(src)), ys), (centre(rank_x(dst)), top(yd)), color=COLORS[src], lw=0.9,
                  style="<|-|>")
    save(fig, "all_reduce_spinlock", "Read, add, write back under the tile's lock at each rank (compare-and-swap "
         "with acquire to take it, release to give it back, scope sys); then wait for every rank's arrival.")


def all_reduce_one_shot() -> None:
    rows = ["src (heap)", "dst"]
    fig, ax = new_figure("all_reduce_one_shot: publish, then every rank reads every peer and reduces locally", rows)
    ys, yd = row_y(rows, 0), row_y(rows, 1)
    for r in range(W):
        tile(ax, rank_x(r), ys, [r], label="+ ready flag")
        tile(ax, rank_x(r), yd, range(W))
    for dst in range(W):
        for src in range(W):
            arrow(ax, (centre(rank_x(src)), ys), (centre(rank_x(dst)), top(yd)), color=COLORS[src], lw=0.9,
                  step=2 if src == dst else None)
    ax.text(rank_x(0) - 0.4, ys + 0.85, "1: store own tile, raise flag (release, sys)", fontsize=8)
    save(fig, "all_reduce_one_shot", "Each rank loads the tile from all W ranks (after their flags, acquire) and "
         "sums in registers: (W-1) remote reads per tile, one step.")


def all_reduce_two_shot() -> None:
    rows = ["src (heap)", "share r of the rows", "dst"]
    fig, ax = new_figure("all_reduce_two_shot: each rank reduces its share of the rows, then writes it everywhere",
                         rows, 4.6)
    ys, ym, yd = row_y(rows, 0), row_y(rows, 1), row_y(rows, 2)
    for r in range(W):
        tile(ax, rank_x(r), ys, [r], label="+ ready flag")
        tile(ax, rank_x(r), ym, range(W), size=0.45, label=f"share {r}")
        tile(ax, rank_x(r), yd, range(W), label="+ done flag")
    for reducer in range(W):
        for src in range(W):
            arrow(ax, (centre(rank_x(src)), ys), (rank_x(reducer) + 0.22, ym + 0.45), color=COLORS[src], lw=0.7,
                  step=1 if src == reducer else None)
        for dst in range(W):
            arrow(ax, (rank_x(reducer) + 0.22, ym), (centre(rank_x(dst)), top(yd)), color="#333", lw=0.7,
                  step=2 if dst == reducer else None)
    save(fig, "all_reduce_two_shot", "Every rank reads its share of the tile's rows from all W ranks and sums them "
         "(1), then stores that share of the sum to every rank (2); shares rotate from tile to tile. Each element is "
         "read once from every rank and written once to every rank.")


def all_reduce_ring() -> None:
    fig, ax = plt.subplots(figsize=(9.5, 4.2))
    ax.set_xlim(-3.2, 6.8)
    ax.set_ylim(-2.4, 2.2)
    ax.axis("off")
    ax.set_title("all_reduce_ring: the partial sum travels round the ring (W-1 steps), then the result does",
                 fontsize=12, loc="left")
    import math

    pos = [(1.6 * math.cos(math.pi / 2 - 2 * math.pi * r / W), 1.6 * math.sin(math.pi / 2 - 2 * math.pi * r / W))
           for r in range(W)]
    for r, (x, y) in enumerate(pos):
        ax.text(x, y + 0.5, f"rank {r}", ha="center", fontsize=10, weight="bold")
        tile(ax, x - 0.35, y - 0.35, [r])
    # One tile that starts at rank 0: reduce pass (steps 1..W-1), then the result goes round
    # (steps W..2W-2). The arrow from rank r to r+1 carries step r+1 and, in the second pass,
    # step W+r+1 (the last rank of the second pass does not send).
    for r in range(W):
        (x0, y0), (x1, y1) = pos[r], pos[(r + 1) % W]
        if r == W - 1:
            steps = [W]  # the finished sum leaves the last rank
        else:
            steps = [r + 1] + ([W + r + 1] if W + r + 1 <= 2 * W - 2 else [])
        arrow(ax, (x0, y0), (x1, y1), color=COLORS[r], rad=-0.25, step=", ".join(map(str, steps)))
    ax.text(3.0, 1.7, "one tile, starting at rank 0:", fontsize=9)
    for step in range(W):
        y = 1.1 - step * 0.8
        tile(ax, 3.2, y - 0.2, range(0, step + 1), size=0.55)
        if step == 0:
            text = "rank 0 sends its tile (step 1)"
        elif step < W - 1:
            text = f"rank {step} adds its own, sends on (step {step + 1})"
        else:
            text = f"rank {step} has the sum: rounds it, steps {W}..{2 * W - 2} pass it round"
        ax.text(3.95, y + 0.05, text, fontsize=8, va="center")
    save(fig, "all_reduce_ring", "Tile t starts at rank t % W, so every rank starts some tiles. Data moves only "
         "between neighbours, into the receiver's dst tile, with a flag per step and a credit before each write "
         "(release/acquire, sys).")


# --- moving tiles -----------------------------------------------------------------------------

def all_gather() -> None:
    rows = ["tile (registers)", "dst (W slots)"]
    fig, ax = new_figure("all_gather(tile, dst_view, dim): every rank stores its tile into its own slot on every rank",
                         rows)
    ys, yd = row_y(rows, 0), row_y(rows, 1)
    for r in range(W):
        tile(ax, rank_x(r) + 0.2, ys, [r], size=0.45)
        for s in range(W):
            tile(ax, rank_x(r) + s * 0.45 - 0.3, yd, [s], size=0.42)
    for src in range(W):
        for dst in range(W):
            arrow(ax, (rank_x(src) + 0.42, ys), (rank_x(dst) + src * 0.45 - 0.09, yd + 0.42), color=COLORS[src],
                  lw=0.8)
    save(fig, "all_gather", "dim=0 stacks the ranks' tiles along rows (rank r at rows r*M ...), dim=1 along "
         "columns. Plain remote stores: complete after a barrier (or a flag) on the receiving side.")


def gather() -> None:
    rows = ["src (heap)", "returned tile"]
    fig, ax = new_figure("gather(tile, src_view, source_rank): load a tile from one rank", rows)
    ys, yd = row_y(rows, 0), row_y(rows, 1)
    source = 2
    for r in range(W):
        tile(ax, rank_x(r), ys, [r])
        tile(ax, rank_x(r), yd, [source], label="registers")
        arrow(ax, (centre(rank_x(source)), ys), (centre(rank_x(r)), top(yd)), color=COLORS[source])
    save(fig, "gather", f"Every rank reads the same tile from source_rank (here {source}) and gets it back as a value; "
         "the source must have written it before (barrier or flag).")


def all_to_all() -> None:
    rows = ["src (W chunks)", "dst (W chunks)"]
    fig, ax = new_figure("all_to_all(tile, src_view, dst_view, N_per_rank): chunk j of rank i -> chunk i of rank j",
                         rows)
    ys, yd = row_y(rows, 0), row_y(rows, 1)
    for r in range(W):
        for c in range(W):
            tile(ax, rank_x(r) + c * 0.45 - 0.3, ys, [r], size=0.42)
            tile(ax, rank_x(r) + c * 0.45 - 0.3, yd, [c], size=0.42)
            ax.text(rank_x(r) + c * 0.45 - 0.09, ys + 0.21, str(c), fontsize=6, ha="center", va="center",
                    color="white")
    for i in range(W):
        for j in range(W):
            arrow(ax, (rank_x(i) + j * 0.45 - 0.09, ys), (rank_x(j) + i * 0.45 - 0.09, yd + 0.42),
                  color=COLORS[i], lw=0.7)
    save(fig, "all_to_all", "Columns are split in chunks of N_per_rank: rank i sends its chunk j to rank j, which "
         "stores it as chunk i (a transpose of chunks across ranks).")


def reduce_scatter() -> None:
    rows = ["src (heap, all tiles)", "dst (own block)"]
    fig, ax = new_figure("reduce_scatter: each rank reduces its own contiguous block of tiles", rows)
    ys, yd = row_y(rows, 0), row_y(rows, 1)
    for r in range(W):
        for c in range(W):
            tile(ax, rank_x(r) + c * 0.45 - 0.3, ys, [r], size=0.42)
        tile(ax, rank_x(r) + r * 0.45 - 0.3, yd, range(W), size=0.42)
    for owner in range(W):
        for src in range(W):
            arrow(ax, (rank_x(src) + owner * 0.45 - 0.09, ys), (rank_x(owner) + owner * 0.45 - 0.09, yd + 0.42),
                  color=COLORS[src], lw=0.7)
    save(fig, "reduce_scatter", "Tile block b belongs to rank b: it reads block b from every rank (after their ready "
         "flags), sums, and stores the sum only locally.")


FIGURES = [all_reduce_atomic, all_reduce_spinlock, all_reduce_one_shot, all_reduce_two_shot, all_reduce_ring,
           all_gather, gather, all_to_all, reduce_scatter]


def main() -> None:
    for draw in FIGURES:
        draw()
        print("wrote", os.path.join(OUT, draw.__name__ + ".png"))


if __name__ == "__main__":
    main()
