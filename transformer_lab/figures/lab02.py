"""Lab 02's diagrams: the matrices of one self-attention layer, and what one query attends to.

* :func:`attention_shapes`: ``X``, ``W_q``, ``Q``, ``K^T``, ``A``, ``V`` drawn to scale, in the
  course's row convention and in Prince's column convention, one token outlined throughout;
* :func:`attention_to_text`: a text with each word shaded by one query's attention weight.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from torch import Tensor

from transformer_lab.figures.draw import HIGHLIGHT, SQUARE, box, grid

__all__ = ["attention_shapes", "attention_to_text"]


# Colours of the lab 02 diagrams: inputs, weights, queries, keys, values, scores and outputs.
_COLOURS = {
    "X": "#d9d9d9",
    "W": "#fff2b3",
    "Q": "#9ecae1",
    "K": "#a1d99b",
    "V": "#fdae6b",
    "A": "#bcbddc",
    "out": "#fc9272",
}


def _matrix(
    ax: Axes,
    x: float,
    y_mid: float,
    rows: int,
    cols: int,
    name: str,
    shape: str,
    colour: str,
    *,
    unit: float,
    row: int | None = None,
    col: int | None = None,
) -> float:
    """Draw a ``rows x cols`` matrix centred vertically on ``y_mid``; return its right edge.

    ``row``/``col`` outline one row or column (the token followed through the diagram).
    """
    width, height = cols * unit, rows * unit
    bottom = y_mid - height / 2
    grid(ax, x, bottom + height, rows, cols, colour, pitch=unit, linewidth=0.8)
    outline = {"style": SQUARE, "edgecolor": "black", "linewidth": 1.0}
    box(ax, x + width / 2, y_mid, width, height, "", "none", **outline)
    outline.update(edgecolor=HIGHLIGHT, linewidth=2.0)
    if row is not None:
        box(
            ax,
            x + width / 2,
            bottom + (rows - row - 0.5) * unit,
            width,
            unit,
            "",
            "none",
            **outline,
        )
    if col is not None:
        box(ax, x + (col + 0.5) * unit, y_mid, unit, height, "", "none", **outline)
    ax.text(x + width / 2, bottom + height + 0.12, name, ha="center", va="bottom", fontsize=10)
    ax.text(x + width / 2, bottom - 0.12, shape, ha="center", va="top", fontsize=8)
    return x + width


def _equation(ax: Any, y_mid: float, items: Sequence[Any], *, unit: float, x: float = 0.0) -> float:
    """Lay out matrices (dicts of :func:`_matrix` arguments) and operators in a row.

    An operator is a string (0.5 wide) or a pair ``(text, width)``.
    """
    for item in items:
        if isinstance(item, str | tuple):
            text, width = (item, 0.5) if isinstance(item, str) else item
            ax.text(x + width / 2, y_mid, text, ha="center", va="center", fontsize=12)
            x += width
        else:
            x = _matrix(ax, x, y_mid, unit=unit, **item) + 0.1
    return x


def attention_shapes(n: int = 5, d: int = 6, d_k: int = 4, d_v: int = 3, token: int = 1) -> Figure:
    """The matrices of one self-attention layer, drawn to scale, in both conventions.

    Left: this course's row convention (tokens in rows, ``X`` is ``N x D``, weights act from
    the right: ``Q = X W_q + b_q``, ``A = softmax_rows(Q K^T / sqrt(D_k))``, ``out = A V``).
    Right: Prince's column convention (tokens in columns, ``X`` is ``D x N``, weights act from
    the left: ``Q = beta_q 1^T + Omega_q X``, ``A = Softmax_cols(K^T Q / sqrt(D_q))``,
    ``out = V A``). One token (``token``) is outlined in red through every step: a row on the
    left, a column on the right. Every matrix on the right is the transpose of its partner on
    the left.

    Args:
        n: tokens ``N``.
        d: model width ``D``.
        d_k: width of queries and keys.
        d_v: width of values.
        token: the token to outline (``0 <= token < n``).

    Returns:
        The figure.

    Raises:
        ValueError: if a size is not positive or ``token`` is out of range.
    """
    if min(n, d, d_k, d_v) < 1:
        raise ValueError(f"sizes must be positive, got n={n}, d={d}, d_k={d_k}, d_v={d_v}")
    if not 0 <= token < n:
        raise ValueError(f"token={token} lies outside 0..{n - 1}")
    unit = 0.32
    fig = Figure(figsize=(13.5, 7.2), layout="constrained")
    left, right = fig.subplots(1, 2)
    c = _COLOURS

    def m(rows: int, cols: int, name: str, shape: str, colour: str, **kw: Any) -> dict[str, Any]:
        return {"rows": rows, "cols": cols, "name": name, "shape": shape, "colour": colour, **kw}

    rows_lines = [
        [
            m(n, d, "$X$", f"N x D = {n} x {d}", c["X"], row=token),
            "@",
            m(d, d_k, "$W_q$", f"D x D_k = {d} x {d_k}", c["W"]),
            "+",
            m(1, d_k, "$b_q$", "1 x D_k", c["W"]),
            "=",
            m(n, d_k, "$Q$", f"N x D_k = {n} x {d_k}", c["Q"], row=token),
        ],
        [
            m(n, d_k, "$Q$", f"{n} x {d_k}", c["Q"], row=token),
            "@",
            m(d_k, n, "$K^\\top$", f"D_k x N = {d_k} x {n}", c["K"]),
            ("$/\\sqrt{D_k}$", 1.0),
            ("softmax\nof rows\n\u2192", 1.5),
            m(n, n, "$A$", f"N x N = {n} x {n}", c["A"], row=token),
        ],
        [
            m(n, n, "$A$", f"{n} x {n}", c["A"], row=token),
            "@",
            m(n, d_v, "$V$", f"N x D_v = {n} x {d_v}", c["V"]),
            "=",
            m(n, d_v, "out", f"N x D_v = {n} x {d_v}", c["out"], row=token),
        ],
    ]
    book_lines = [
        [
            m(d_k, d, "$\\Omega_q$", f"D_q x D = {d_k} x {d}", c["W"]),
            "@",
            m(d, n, "$X$", f"D x N = {d} x {n}", c["X"], col=token),
            "+",
            m(d_k, 1, "$\\beta_q\\mathbf{1}^\\top$", "D_q x 1", c["W"]),
            "=",
            m(d_k, n, "$Q$", f"D_q x N = {d_k} x {n}", c["Q"], col=token),
        ],
        [
            m(n, d_k, "$K^\\top$", f"N x D_q = {n} x {d_k}", c["K"]),
            "@",
            m(d_k, n, "$Q$", f"{d_k} x {n}", c["Q"], col=token),
            ("$/\\sqrt{D_q}$", 1.0),
            ("Softmax\nof columns\n\u2192", 1.5),
            m(n, n, "$A$", f"N x N = {n} x {n}", c["A"], col=token),
        ],
        [
            m(d_v, n, "$V$", f"D_v x N = {d_v} x {n}", c["V"]),
            "@",
            m(n, n, "$A$", f"{n} x {n}", c["A"], col=token),
            "=",
            m(d_v, n, "out", f"D_v x N = {d_v} x {n}", c["out"], col=token),
        ],
    ]
    notes_rows = [
        "b_q is added to every row; K = X W_k + b_k and V = X W_v + b_v alike (W_v: D x D_v)",
        "each ROW of A sums to 1: the weights of one query over all keys",
        "row n of out = sum over m of A[n, m] * (row m of V)",
    ]
    notes_book = [
        "Omega_q = W_q transposed; beta_q = b_q, added to every column",
        "each COLUMN of A sums to 1 (A_book = A^T)",
        "column n of out = sum over m of (column m of V) * A[m, n]",
    ]
    height = max(n, d, d_k) * unit + 1.3
    for ax, lines, notes, title in (
        (left, rows_lines, notes_rows, "this course: tokens in rows (X is N x D)"),
        (right, book_lines, notes_book, "Prince's book: tokens in columns (X is D x N)"),
    ):
        width = 0.0
        for i, (line, note) in enumerate(zip(lines, notes, strict=True)):
            y = -i * height
            width = max(width, _equation(ax, y, line, unit=unit))
            ax.text(0.0, y - height / 2 + 0.05, note, fontsize=8.5, style="italic", va="bottom")
        ax.set_xlim(-0.2, max(width, 6.5) + 0.2)
        ax.set_ylim(-2.5 * height - 0.2, height / 2 + 0.1)
        ax.set_aspect("equal")
        ax.axis("off")
        ax.set_title(title, fontsize=11)
    fig.suptitle(
        f"one self-attention layer, N={n} tokens (token {token} outlined in red)", fontsize=12
    )
    return fig


def attention_to_text(
    tokens: Sequence[str],
    weights: Tensor | Sequence[float],
    query: int,
    *,
    per_line: int = 10,
    top: int = 3,
    title: str | None = None,
) -> Figure:
    """The text with each word shaded by how much one query attends to it.

    Args:
        tokens: the ``S`` words (keys), in order.
        weights: the query's attention weights over them, ``(S,)`` (one row of ``A``).
        query: index of the query word (outlined in red).
        per_line: words per line of text.
        top: how many of the largest weights to print on their words.
        title: the figure title (default: ``what "<query word>" attends to``).

    Returns:
        The figure.

    Raises:
        ValueError: if the lengths differ or ``query`` is out of range.
    """
    from matplotlib import colormaps

    w = torch.as_tensor(weights, dtype=torch.float64).detach().cpu().flatten()
    if w.numel() != len(tokens):
        raise ValueError(f"{w.numel()} weights for {len(tokens)} tokens")
    if not 0 <= query < len(tokens):
        raise ValueError(f"query={query} lies outside 0..{len(tokens) - 1}")
    lines = (len(tokens) + per_line - 1) // per_line
    fig = Figure(figsize=(1.15 * per_line + 0.5, 0.75 * lines + 1.0), layout="constrained")
    ax = fig.add_subplot()
    cmap = colormaps["Blues"]
    peak = float(w.max()) if w.numel() and float(w.max()) > 0 else 1.0
    best = set(torch.argsort(w, descending=True)[:top].tolist())
    for i, word in enumerate(tokens):
        x, y = (i % per_line) * 1.15, -(i // per_line) * 0.75
        shade = float(w[i]) / peak
        colour = "white" if shade > 0.6 else "black"
        box(
            ax, x + 0.525, y + 0.225, 1.05, 0.45, word, cmap(0.05 + 0.9 * shade),
            style="round,pad=0.02", edgecolor=HIGHLIGHT if i == query else "none", linewidth=2.0,
            color=colour,
        )  # fmt: skip
        if i in best:
            ax.text(x + 0.525, y + 0.5, f"{float(w[i]):.2f}", ha="center", va="bottom", fontsize=7)
    ax.set_xlim(-0.1, per_line * 1.15)
    ax.set_ylim(-(lines - 1) * 0.75 - 0.1, 0.8)
    ax.axis("off")
    ax.set_title(title or f'what "{tokens[query]}" attends to (darker = more weight)', fontsize=11)
    return fig
