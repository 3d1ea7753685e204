"""Lab 05's figures: masks as grids, attention weights as heat maps, and a race of loss curves.

* :func:`mask_grid`: boolean masks, a filled cell may attend (True), an empty one is hidden;
* :func:`weight_grid`: attention weights ``(T, S)`` as heat maps with their row sums;
* :func:`loss_race`: training-loss curves (log scale) with reference levels, e.g. the honest
  model against one that looks at the future.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from torch import Tensor

from transformer_lab.figures.draw import label_cells, panel_figure

__all__ = ["loss_race", "mask_grid", "weight_grid"]


def _panels(tables: Mapping[str, Tensor]) -> list[tuple[str, Tensor]]:
    panels = []
    for title, table in tables.items():
        t = table.detach().to("cpu")
        if t.dim() != 2:
            raise ValueError(f"panel {title!r} has shape {tuple(t.shape)}; expected a 2-D table")
        panels.append((title, t))
    if not panels:
        raise ValueError("nothing to draw: pass at least one table")
    return panels


def mask_grid(
    masks: Mapping[str, Tensor],
    *,
    row_labels: Sequence[Sequence[str] | None] | None = None,
    col_labels: Sequence[Sequence[str] | None] | None = None,
    ylabel: str = "query",
    xlabel: str = "key",
) -> Figure:
    """Boolean masks as grids: a filled cell may attend (True), an empty one is hidden.

    Args:
        masks: panel title -> a 2-D mask, e.g. ``(T, T)`` (rows are queries, columns keys) or a
            padding mask ``(B, T)`` (rows are sequences).
        row_labels: per panel, labels of the rows (e.g. the words of a sentence), or None.
        col_labels: per panel, labels of the columns, or None.
        ylabel: what the rows are.
        xlabel: what the columns are.

    Returns:
        A figure with one panel per mask.
    """
    panels = _panels(masks)
    shape = max((tuple(t.shape) for _, t in panels), key=lambda rc: rc[0] * rc[1])
    fig, axes = panel_figure(len(panels), 0.38, shape)
    colours = ListedColormap(["#f2f2f2", "#2c7fb8"])
    for i, (ax, (title, t)) in enumerate(zip(axes, panels, strict=True)):
        ax.imshow(t.to(torch.bool).numpy(), cmap=colours, vmin=0, vmax=1)
        rows = row_labels[i] if row_labels else None
        cols = col_labels[i] if col_labels else None
        label_cells(ax, tuple(t.shape), rows, cols, ylabel, xlabel)
        ax.set_title(title, fontsize=9)
    fig.suptitle("filled: may attend (True); empty: hidden (False)", fontsize=9)
    return fig


def weight_grid(
    weights: Mapping[str, Tensor],
    *,
    row_labels: Sequence[Sequence[str] | None] | None = None,
    col_labels: Sequence[Sequence[str] | None] | None = None,
    annotate: bool = True,
) -> Figure:
    """Attention weights ``(T, S)`` as heatmaps, queries in rows and keys in columns.

    Args:
        weights: panel title -> a ``(T, S)`` table of weights in ``[0, 1]``.
        row_labels: per panel, labels of the queries, or None.
        col_labels: per panel, labels of the keys, or None (default: the row labels).
        annotate: write each weight in its cell (for small tables).

    Returns:
        A figure with one heatmap per table; a cell of exactly 0 (a masked key) is left blank,
        and each panel's title gives the smallest and largest row sum.
    """
    panels = _panels(weights)
    shape = max((tuple(t.shape) for _, t in panels), key=lambda rc: rc[0] * rc[1])
    fig, axes = panel_figure(len(panels), 0.5, shape)
    image = None
    for i, (ax, (title, t)) in enumerate(zip(axes, panels, strict=True)):
        w = t.float()
        shown = np.ma.masked_equal(w.numpy(), 0.0)
        image = ax.imshow(shown, cmap="viridis", vmin=0.0, vmax=1.0)
        ax.set_facecolor("#f2f2f2")
        rows = row_labels[i] if row_labels else None
        cols = col_labels[i] if col_labels else rows
        label_cells(ax, tuple(w.shape), rows, cols, "query", "key")
        if annotate:
            for r in range(w.shape[0]):
                for c in range(w.shape[1]):
                    if float(w[r, c]) != 0.0:
                        colour = "black" if float(w[r, c]) > 0.6 else "white"
                        ax.text(
                            c,
                            r,
                            f"{float(w[r, c]):.2f}",
                            ha="center",
                            va="center",
                            fontsize=6,
                            color=colour,
                        )
        sums = w.sum(-1)
        ax.set_title(
            f"{title}\nrow sums {float(sums.min()):.2f}..{float(sums.max()):.2f}", fontsize=9
        )
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
    return fig


def loss_race(
    curves: Mapping[str, Sequence[float]],
    *,
    levels: Mapping[str, float] | None = None,
    title: str = "training loss",
) -> Figure:
    """Training-loss curves side by side (log scale), with reference levels as dashed lines.

    Args:
        curves: label -> loss per training step.
        levels: label -> a loss to mark across the plot (e.g. a model's loss at generation
            time), or None.
        title: the figure's title.

    Returns:
        A figure with one line per curve and one dashed line per level.
    """
    if not curves:
        raise ValueError("nothing to draw: pass at least one loss curve")
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.add_subplot()
    colours = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a"]
    for i, (label, values) in enumerate(curves.items()):
        ax.plot(range(1, len(values) + 1), list(values), label=label, color=colours[i % 4], lw=1.2)
    for i, (label, value) in enumerate((levels or {}).items()):
        ax.axhline(value, ls="--", lw=1.0, color=colours[(i + 2) % 4], label=label)
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("cross-entropy (nats per word)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig
