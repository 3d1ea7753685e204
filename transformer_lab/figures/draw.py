"""The one drawing vocabulary of the labs' diagrams: a box, an arrow, a grid, a panel figure.

Every diagram of :mod:`transformer_lab.figures` is drawn from these four pieces, so a block
diagram of lab 04 and one of lab 08 speak the same visual language and a change of style is
made once:

* :func:`box`: a (rounded or square) box centred on a point, with its label inside: the
  sub-layers of a block diagram, the words of a sentence, the pieces of a BPE split, an outline;
* :func:`arrow`: a polyline with an arrow head at its end, with an optional label: data flow,
  residual paths, the steps of a shape walk-through;
* :func:`grid`: a ``rows x cols`` grid of square cells, one colour per cell (a constant, or a
  function of the cell): matrices drawn to scale, heads, masks, what a KV cache stores;
* :func:`panel_figure` and :func:`label_cells`: a figure of heat-map panels side by side, sized
  for its tables, and the ticks and cell lines of one such panel (masks, attention weights).

Coordinates are data coordinates of the axes drawn on. Nothing here touches pyplot.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Rectangle

__all__ = ["HIGHLIGHT", "arrow", "box", "grid", "label_cells", "panel_figure"]

#: The red that outlines what a diagram follows (one token, the rows of an embedding in use).
HIGHLIGHT = "#d62728"
#: The block diagrams' box: rounded corners, a dark grey edge.
ROUNDED = "round,pad=0.02,rounding_size=0.08"
#: A box with square corners and no padding: exactly ``w x h``.
SQUARE = "square,pad=0"

Colour = Any  # a matplotlib colour: a name, "#rrggbb", a grey level "0.4", an RGB(A) tuple


def box(
    ax: Axes,
    x: float,
    y: float,
    w: float,
    h: float,
    text: str = "",
    colour: Colour = "white",
    *,
    style: str = ROUNDED,
    edgecolor: Colour = "0.25",
    linewidth: float = 1.0,
    linestyle: str = "-",
    fontsize: float = 9,
    **text_kw: Any,
) -> None:
    """A ``w x h`` box centred on ``(x, y)`` with ``text`` in its middle.

    Args:
        ax: the axes drawn on.
        x, y: the centre.
        w, h: width and height (``style``'s padding adds around them).
        text: the label, centred (nothing when empty).
        colour: the fill; ``"none"`` draws an outline only.
        style: a matplotlib ``boxstyle``: :data:`ROUNDED` (default), :data:`SQUARE`, ...
        edgecolor, linewidth, linestyle: the edge (``edgecolor="none"``: no edge).
        fontsize: the label's size.
        **text_kw: more options of the label (``color``, ``family``, ...).
    """
    ax.add_patch(
        FancyBboxPatch(
            (x - w / 2, y - h / 2),
            w,
            h,
            boxstyle=style,
            facecolor=colour,
            edgecolor=edgecolor,
            linewidth=linewidth,
            linestyle=linestyle,
        )
    )
    if text:
        ax.text(x, y, text, ha="center", va="center", fontsize=fontsize, **text_kw)


def arrow(
    ax: Axes,
    points: Sequence[tuple[float, float]],
    *,
    colour: Colour = "0.2",
    linewidth: float = 1.2,
    head: str = "->",
    label: str = "",
    label_kw: dict[str, Any] | None = None,
    **arrowprops: Any,
) -> None:
    """An arrow along ``points`` (a start, any corners, an end), its head at the end.

    Args:
        ax: the axes drawn on.
        points: two or more ``(x, y)``; the segments before the last are plain lines.
        colour: the line's colour.
        linewidth: the line's width.
        head: a matplotlib ``arrowstyle`` (``"->"`` open, ``"-|>"`` filled).
        label: text written above the middle of the last segment (nothing when empty).
        label_kw: options of the label (default: size 7, lines 1.3 apart).
        **arrowprops: more ``arrowprops`` of the head segment (``connectionstyle``,
            ``shrinkA``, ...).
    """
    if len(points) < 2:
        raise ValueError(f"an arrow needs two or more points, got {len(points)}")
    if len(points) > 2:
        xs, ys = zip(*points[:-1], strict=True)
        ax.plot(xs, ys, color=colour, linewidth=linewidth)
    start, end = points[-2], points[-1]
    props = {"arrowstyle": head, "color": colour, "lw": linewidth, **arrowprops}
    ax.annotate("", xy=end, xytext=start, arrowprops=props)
    if label:
        options = {"fontsize": 7, "linespacing": 1.3, **(label_kw or {})}
        middle = ((start[0] + end[0]) / 2, (start[1] + end[1]) / 2 + 0.3)
        ax.text(*middle, label, ha="center", va="bottom", **options)


def grid(
    ax: Axes,
    x: float,
    top: float,
    rows: int,
    cols: int,
    colour: Colour | Callable[[int, int], Colour],
    *,
    pitch: float = 1.0,
    size: float | None = None,
    edgecolor: Colour = "white",
    linewidth: float = 1.0,
) -> None:
    """A ``rows x cols`` grid of square cells, row 0 on top, its top-left corner at ``(x, top)``.

    Args:
        ax: the axes drawn on.
        x, top: the top-left corner.
        rows, cols: the grid's size in cells.
        colour: one colour for every cell, or ``colour(i, j)`` for cell ``(row i, column j)``
            (``"white"`` leaves a cell empty).
        pitch: the distance between neighbouring cells' corners.
        size: a cell's side (default ``pitch``: cells touch; smaller leaves gaps).
        edgecolor, linewidth: the cells' edges.
    """
    side = pitch if size is None else size
    for i in range(rows):
        for j in range(cols):
            c = colour(i, j) if callable(colour) else colour
            corner = (x + j * pitch, top - (i + 1) * pitch)
            ax.add_patch(
                Rectangle(corner, side, side, facecolor=c, edgecolor=edgecolor, lw=linewidth)
            )


def panel_figure(n: int, cell: float, rows_cols: tuple[int, int]) -> tuple[Figure, list[Axes]]:
    """A figure with ``n`` panels side by side, each sized for a ``rows x cols`` table."""
    rows, cols = rows_cols
    width = max(2.2, cell * cols + 1.0)
    height = max(2.0, cell * rows + 1.0)
    fig = Figure(figsize=(width * n, height), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False)[0]
    return fig, list(axes)


def label_cells(
    ax: Axes,
    shape: tuple[int, int],
    row_labels: Sequence[str] | None,
    col_labels: Sequence[str] | None,
    ylabel: str,
    xlabel: str,
) -> None:
    """Ticks (labels, or indices) and white lines between the cells of a heat-map panel."""
    rows, cols = shape
    ax.set_yticks(range(rows), labels=list(row_labels) if row_labels else range(rows))
    ax.set_xticks(range(cols), labels=list(col_labels) if col_labels else range(cols))
    if col_labels:
        ax.tick_params(axis="x", labelrotation=90)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_xticks([c - 0.5 for c in range(1, cols)], minor=True)
    ax.set_yticks([r - 0.5 for r in range(1, rows)], minor=True)
    ax.grid(which="minor", color="white", linewidth=1.0)
    ax.tick_params(which="minor", length=0)
