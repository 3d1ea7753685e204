"""Diagrams drawn in code for the labs: what the lecture draws on the board, as matplotlib figures.

Each function returns a ``matplotlib.figure.Figure`` (built without pyplot, so it also works
headless) that a lab's demo cell displays. Shapes in labels follow the course's row convention
(``X`` is ``(N, D)``, tokens in rows) and the shape letters of ``transformer_lab.attention``.

Sections, one per lab; a lab adds its diagrams to its own section.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Circle, FancyBboxPatch, Rectangle
from torch import Tensor

__all__: list[str] = ["attention_shapes", "attention_to_text", "encoder_block_diagram"]

# --------------------------------------------------------------------------------------
# Lab 02: self-attention (queries, keys, values and the matrix shapes)
# --------------------------------------------------------------------------------------

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
_HIGHLIGHT = "#d62728"


def _matrix(
    ax: Any,
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
    """Draw a ``rows x cols`` grid centred vertically on ``y_mid``; return its right edge.

    ``row``/``col`` outline one row or column (the token followed through the diagram).
    """
    from matplotlib.patches import Rectangle

    width, height = cols * unit, rows * unit
    bottom = y_mid - height / 2
    ax.add_patch(Rectangle((x, bottom), width, height, facecolor=colour, edgecolor="none"))
    # The cells: white grid lines, one collection per direction.
    ax.vlines(
        [x + j * unit for j in range(1, cols)], bottom, bottom + height, colors="white", lw=0.8
    )
    ax.hlines([bottom + i * unit for i in range(1, rows)], x, x + width, colors="white", lw=0.8)
    ax.add_patch(Rectangle((x, bottom), width, height, fill=False, edgecolor="black", lw=1.0))
    if row is not None:
        ax.add_patch(
            Rectangle(
                (x, bottom + (rows - 1 - row) * unit), width, unit,
                fill=False, edgecolor=_HIGHLIGHT, lw=2.0,
            )
        )  # fmt: skip
    if col is not None:
        ax.add_patch(
            Rectangle(
                (x + col * unit, bottom), unit, height, fill=False, edgecolor=_HIGHLIGHT, lw=2.0
            )
        )
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
    from matplotlib.patches import FancyBboxPatch

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
        ax.add_patch(
            FancyBboxPatch(
                (x, y), 1.05, 0.45, boxstyle="round,pad=0.02",
                facecolor=cmap(0.05 + 0.9 * shade),
                edgecolor=_HIGHLIGHT if i == query else "none", linewidth=2.0,
            )
        )  # fmt: skip
        colour = "white" if shade > 0.6 else "black"
        ax.text(x + 0.525, y + 0.225, word, ha="center", va="center", fontsize=9, color=colour)
        if i in best:
            ax.text(x + 0.525, y + 0.5, f"{float(w[i]):.2f}", ha="center", va="bottom", fontsize=7)
    ax.set_xlim(-0.1, per_line * 1.15)
    ax.set_ylim(-(lines - 1) * 0.75 - 0.1, 0.8)
    ax.axis("off")
    ax.set_title(title or f'what "{tokens[query]}" attends to (darker = more weight)', fontsize=11)
    return fig


# --------------------------------------------------------------------------------------
# Lab 03: multi-head attention (splitting and merging heads)
# --------------------------------------------------------------------------------------

# The heads' colours (matplotlib's "tab10") and the grey of what the output projection mixes.
_HEAD_COLOURS = (
    (0.12, 0.47, 0.71),
    (1.00, 0.50, 0.05),
    (0.17, 0.63, 0.17),
    (0.84, 0.15, 0.16),
    (0.58, 0.40, 0.74),
    (0.55, 0.34, 0.29),
    (0.89, 0.47, 0.76),
    (0.50, 0.50, 0.50),
)


def _head_colour(head: int, token: int = 0, n_tokens: int = 1) -> tuple[float, float, float]:
    """Head ``head``'s colour, lighter for later tokens (so rows can be told apart)."""
    r, g, b = _HEAD_COLOURS[head % len(_HEAD_COLOURS)]
    mix = 0.55 * token / max(n_tokens - 1, 1)
    return (r + (1 - r) * mix, g + (1 - g) * mix, b + (1 - b) * mix)


def _grid(
    ax: Any, x0: float, y0: float, rows: int, cols: int, colour: Any, label: str = ""
) -> None:
    """A ``rows x cols`` grid of unit cells with its top-left corner at ``(x0, y0)``."""
    from matplotlib.patches import Rectangle

    for i in range(rows):
        for j in range(cols):
            c = colour(i, j) if callable(colour) else colour
            ax.add_patch(Rectangle((x0 + j, y0 - i - 1), 1, 1, facecolor=c, edgecolor="white"))
    if label:
        ax.text(x0 + cols / 2, y0 + 0.35, label, ha="center", va="bottom", fontsize=8)


def _arrow(ax: Any, x0: float, x1: float, y: float, text: str) -> None:
    ax.annotate("", xy=(x1, y), xytext=(x0, y), arrowprops={"arrowstyle": "->", "lw": 1.2})
    ax.text((x0 + x1) / 2, y + 0.3, text, ha="center", va="bottom", fontsize=7, linespacing=1.3)


def head_split_diagram(seq_len: int = 4, d_model: int = 8, n_heads: int = 2) -> Figure:
    """The journey of one sequence through multi-head attention, with the shapes at each step.

    ``x`` ``(B, T, D)`` -> view ``(B, T, H, Dh)`` -> transpose ``(B, H, T, Dh)`` -> attention in
    every head at once -> transpose back ``(B, T, H, Dh)`` -> reshape ``(B, T, D)`` -> the output
    projection, which mixes the heads. Feature columns are coloured by the head they belong to
    and rows get lighter from the first token to the last, so every cell can be followed.

    Args:
        seq_len: tokens ``T`` drawn.
        d_model: model width ``D``.
        n_heads: heads ``H`` (must divide ``d_model``).

    Returns:
        The figure.

    Raises:
        ValueError: ``d_model`` is not divisible by ``n_heads``, or a size is not positive.
    """
    if min(seq_len, d_model, n_heads) <= 0 or d_model % n_heads:
        raise ValueError(
            f"need positive sizes with n_heads dividing d_model; got seq_len={seq_len}, "
            f"d_model={d_model}, n_heads={n_heads}"
        )
    T, D, H = seq_len, d_model, n_heads
    dh = D // H
    gap = 6.5
    width = 3 * D + 2 * dh + 4 * gap + 4.0
    height = T * H + (H - 1) * 0.6 + 3.2
    fig = Figure(figsize=(0.26 * width, 0.26 * height + 0.3))
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
    top = T * H + (H - 1) * 0.6  # height of the stacked heads

    def by_feature(i: int, j: int) -> Any:
        return _head_colour(j // dh, i, T)

    x = 0.0
    y_mid = top / 2
    _grid(ax, x, y_mid + T / 2, T, D, by_feature, f"x: (B, T, D) = (B, {T}, {D})")
    for t in range(T):
        ax.text(x - 0.3, y_mid + T / 2 - t - 0.5, f"t{t}", ha="right", va="center", fontsize=7)
    for h in range(H):
        ax.text(
            x + h * dh + dh / 2,
            y_mid - T / 2 - 0.5,
            f"head {h}",
            ha="center",
            va="top",
            fontsize=7,
            color=_head_colour(h),
        )
    x += D
    _arrow(ax, x + 0.3, x + gap - 0.3, y_mid, "split_heads:\nview (B, T, H, Dh)\ntranspose(1, 2)")
    x += gap
    for h in range(H):
        y = top - h * (T + 0.6)
        _grid(ax, x, y, T, dh, lambda i, j, h=h: _head_colour(h, i, T))
        ax.text(x + dh + 0.2, y - T / 2, f"head {h}", ha="left", va="center", fontsize=7)
    ax.text(
        x + dh / 2,
        top + 0.35,
        f"(B, H, T, Dh) = (B, {H}, {T}, {dh})",
        ha="center",
        va="bottom",
        fontsize=8,
    )
    x += dh + 1.5
    _arrow(
        ax, x, x + gap, y_mid, "in every head:\nsoftmax(q k^T / sqrt(Dh)) v\n(B, H, T, T) weights"
    )
    x += gap + 0.3
    for h in range(H):
        y = top - h * (T + 0.6)
        _grid(ax, x, y, T, dh, lambda i, j, h=h: (*_head_colour(h, i, T), 0.55))
    ax.text(
        x + dh / 2,
        top + 0.35,
        "heads' outputs\n(B, H, T, Dh)",
        ha="center",
        va="bottom",
        fontsize=8,
    )
    x += dh + 0.3
    _arrow(ax, x + 0.3, x + gap - 0.3, y_mid, "merge_heads:\ntranspose(1, 2)\nreshape (B, T, D)")
    x += gap
    _grid(
        ax,
        x,
        y_mid + T / 2,
        T,
        D,
        lambda i, j: (*by_feature(i, j), 0.55),
        f"concatenated: (B, T, D) = (B, {T}, {D})",
    )
    x += D
    _arrow(ax, x + 0.3, x + gap - 0.3, y_mid, "out_proj\n(D, D):\nmixes heads")
    x += gap
    _grid(ax, x, y_mid + T / 2, T, D, lambda i, j: (0.45 + 0.1 * i / T,) * 3, "out: (B, T, D)")
    ax.set_xlim(-1.2, x + D + 0.3)
    ax.set_ylim(-1.0, top + 2.0)
    ax.set_aspect("equal")
    ax.axis("off")
    return fig


def split_merge_figure(x: Tensor, heads: Tensor, merged: Tensor) -> Figure:
    """Where every entry of ``x`` went: through a split into heads and a merge back.

    ``x`` holds entry ids ``t * D + d`` (token ``t``, feature ``d``); ``heads`` and ``merged``
    are what a ``split_heads`` and a ``merge_heads`` made of it. Each cell is coloured by the
    head its *original feature* belongs to (lighter for later tokens) and labelled ``t:d``, so
    a correct split shows one colour per head and all tokens in order, and a wrong one shows
    mixed colours or tokens in the wrong rows.

    Args:
        x: ``(T, D)`` or ``(1, T, D)`` of ids ``t * D + d``.
        heads: ``(H, T, Dh)`` or ``(1, H, T, Dh)``.
        merged: ``(T, D)`` or ``(1, T, D)``.

    Returns:
        The figure.

    Raises:
        ValueError: if the shapes do not fit together.
    """
    x, heads, merged = (t.detach().cpu().double() for t in (x, heads, merged))
    x = x[0] if x.dim() == 3 else x
    heads = heads[0] if heads.dim() == 4 else heads
    merged = merged[0] if merged.dim() == 3 else merged
    if x.dim() != 2 or heads.dim() != 3 or merged.shape != x.shape:
        raise ValueError(
            f"expected x (T, D), heads (H, T, Dh), merged (T, D); got {tuple(x.shape)}, "
            f"{tuple(heads.shape)}, {tuple(merged.shape)}"
        )
    T, D = x.shape
    H, _, dh = heads.shape
    if H * dh != D:
        raise ValueError(f"{H} heads of width {dh} do not make d_model={D}")

    def cell(value: float) -> tuple[tuple[float, float, float], str]:
        v = round(value)
        t, d = divmod(v, D)
        if not 0 <= t < T:
            return (0.85, 0.85, 0.85), "?"
        return _head_colour(d // dh, t, T), f"{t}:{d}"

    fig = Figure(
        figsize=(1.2 + 0.42 * (2 * D + H * (dh + 1)), 1.1 + 0.42 * T), layout="constrained"
    )
    axes = fig.subplots(1, 2 + H, width_ratios=[D] + [dh] * H + [D])
    panels = [(x, "x (T, D)")]
    panels += [(heads[h], f"head {h}") for h in range(H)]
    panels += [(merged, "merged (T, D)")]
    for ax, (table, title) in zip(axes, panels, strict=True):
        rows, cols = table.shape
        image = [[cell(float(table[i, j]))[0] for j in range(cols)] for i in range(rows)]
        ax.imshow(image, aspect="equal")
        for i in range(rows):
            for j in range(cols):
                ax.text(j, i, cell(float(table[i, j]))[1], ha="center", va="center", fontsize=6)
        ax.set_xticks([])
        ax.set_yticks(range(rows), labels=[f"t{i}" for i in range(rows)], fontsize=6)
        ax.set_title(title, fontsize=8)
    fig.suptitle(
        "label t:d = token t, feature d; colour = the head that feature belongs to", fontsize=8
    )
    return fig


def query_rows_by_head(
    weights: Sequence[Tensor],
    tokens: Sequence[Sequence[str]],
    query: int,
    titles: Sequence[str] | None = None,
) -> Figure:
    """Where one query looks, head by head: one heat map per sentence, heads in rows.

    Args:
        weights: per sentence, the attention weights ``(H, T, S)`` (or ``(1, H, T, S)``).
        tokens: per sentence, its ``S`` key tokens.
        query: the query position whose row is shown (e.g. the position of "it").
        titles: a title per sentence.

    Returns:
        The figure (weights in ``[0, 1]``, each cell labelled when it is above 0.1).

    Raises:
        ValueError: if the numbers of sentences, tokens or positions disagree.
    """
    if len(weights) != len(tokens) or (titles is not None and len(titles) != len(weights)):
        raise ValueError("one weight tensor, one token list (and one title) per sentence")
    rows = []
    for w, toks in zip(weights, tokens, strict=True):
        w = w.detach().cpu().float()
        w = w[0] if w.dim() == 4 else w
        if w.dim() != 3 or w.shape[-1] != len(toks) or not 0 <= query < w.shape[1]:
            raise ValueError(
                f"weights {tuple(w.shape)} do not fit {len(toks)} tokens / query {query}"
            )
        rows.append(w[:, query])  # (H, S)
    n_heads = rows[0].shape[0]
    fig = Figure(
        figsize=(0.5 * max(len(t) for t in tokens) + 1.5, (0.35 * n_heads + 1.1) * len(rows)),
        layout="constrained",
    )
    axes = fig.subplots(len(rows), 1, squeeze=False)[:, 0]
    image = None
    for k, (ax, row, toks) in enumerate(zip(axes, rows, tokens, strict=True)):
        image = ax.imshow(row.numpy(), vmin=0.0, vmax=1.0, cmap="Blues", aspect="auto")
        for h in range(row.shape[0]):
            for j in range(row.shape[1]):
                if row[h, j] > 0.1:
                    colour = "white" if row[h, j] > 0.6 else "black"
                    ax.text(
                        j,
                        h,
                        f"{float(row[h, j]):.2f}",
                        ha="center",
                        va="center",
                        fontsize=6,
                        color=colour,
                    )
        ax.set_xticks(range(len(toks)), labels=list(toks), fontsize=7, rotation=45)
        ax.set_yticks(
            range(row.shape[0]), labels=[f"head {h}" for h in range(row.shape[0])], fontsize=7
        )
        ax.get_xticklabels()[query].set_fontweight("bold")
        if titles is not None:
            ax.set_title(titles[k], fontsize=8)
    fig.colorbar(image, ax=list(axes), shrink=0.8, label="weight")
    return fig


__all__ += ["head_split_diagram", "query_rows_by_head", "split_merge_figure"]


# --------------------------------------------------------------------------------------
# Lab 04: the transformer block (post-norm and pre-norm)
# --------------------------------------------------------------------------------------

_LAB04_COLOURS = {"attn": "#f6c28b", "ff": "#9cc3e6", "norm": "#b5dfa8"}


def _lab04_box(ax: Axes, x: float, y: float, text: str, kind: str, width: float = 0.46) -> None:
    """A labelled sub-layer box centred at ``(x, y)`` (axes coordinates)."""
    ax.add_patch(
        FancyBboxPatch(
            (x - width / 2, y - 0.035),
            width,
            0.07,
            boxstyle="round,pad=0.008",
            facecolor=_LAB04_COLOURS[kind],
            edgecolor="black",
            linewidth=0.8,
        )
    )
    ax.text(x, y, text, ha="center", va="center", fontsize=8.5)


def _lab04_add(ax: Axes, x: float, y: float) -> None:
    """The residual sum: a circled plus at ``(x, y)``."""
    ax.add_patch(Circle((x, y), 0.022, facecolor="white", edgecolor="black", linewidth=0.8))
    ax.text(x, y - 0.002, "+", ha="center", va="center", fontsize=10)


def _lab04_arrow(ax: Axes, points: list[tuple[float, float]], colour: str = "black") -> None:
    """A polyline through ``points`` with an arrow head at its end."""
    xs, ys = zip(*points, strict=True)
    ax.plot(xs[:-1], ys[:-1], color=colour, linewidth=1.0)
    ax.annotate(
        "",
        xy=points[-1],
        xytext=points[-2],
        arrowprops={"arrowstyle": "-|>", "color": colour, "linewidth": 1.0, "shrinkA": 0},
    )


def _lab04_post_norm(ax: Axes) -> None:
    """Post-norm: each sub-layer's output is added to its input, then the sum is normalised."""
    c, side, res = 0.55, 0.2, "#c0392b"
    _lab04_arrow(ax, [(c, 0.05), (c, 0.145)])
    _lab04_box(ax, c, 0.18, "multi-head self-attention", "attn")
    _lab04_arrow(ax, [(c, 0.215), (c, 0.298)])
    _lab04_add(ax, c, 0.32)
    _lab04_arrow(ax, [(c, 0.342), (c, 0.385)])
    _lab04_box(ax, c, 0.42, "LayerNorm 1", "norm")
    _lab04_arrow(ax, [(c, 0.455), (c, 0.545)])
    _lab04_box(ax, c, 0.58, "feed-forward", "ff")
    _lab04_arrow(ax, [(c, 0.615), (c, 0.698)])
    _lab04_add(ax, c, 0.72)
    _lab04_arrow(ax, [(c, 0.742), (c, 0.785)])
    _lab04_box(ax, c, 0.82, "LayerNorm 2", "norm")
    _lab04_arrow(ax, [(c, 0.855), (c, 0.95)])
    # The residual paths carry the sub-layer's input around it (the "Add" of "Add & Norm").
    _lab04_arrow(ax, [(c, 0.08), (side, 0.08), (side, 0.32), (c - 0.022, 0.32)], res)
    _lab04_arrow(ax, [(c, 0.49), (side, 0.49), (side, 0.72), (c - 0.022, 0.72)], res)
    ax.text(c, 0.0, "x  (B, T, D)", ha="center", va="bottom", fontsize=8.5)
    ax.text(c, 0.965, "to the next block", ha="center", va="bottom", fontsize=8.5)
    ax.text(side - 0.02, 0.2, "residual", color=res, ha="right", va="center", fontsize=8)
    ax.text(
        0.5,
        -0.07,
        "x = LayerNorm1(x + SelfAttention(x))\nx = LayerNorm2(x + FF(x))",
        ha="center",
        va="top",
        fontsize=8.5,
        family="monospace",
    )


def _lab04_pre_norm(ax: Axes) -> None:
    """Pre-norm: each sub-layer sees a normalised copy; the residual stream is never normalised."""
    c, branch, res = 0.32, 0.68, "#c0392b"
    _lab04_arrow(ax, [(c, 0.05), (c, 0.378)], res)
    _lab04_add(ax, c, 0.4)
    _lab04_arrow(ax, [(c, 0.422), (c, 0.778)], res)
    _lab04_add(ax, c, 0.8)
    _lab04_arrow(ax, [(c, 0.822), (c, 0.95)], res)
    _lab04_arrow(ax, [(c, 0.08), (branch, 0.08), (branch, 0.125)])
    _lab04_box(ax, branch, 0.16, "LayerNorm 1", "norm", width=0.5)
    _lab04_arrow(ax, [(branch, 0.195), (branch, 0.245)])
    _lab04_box(ax, branch, 0.28, "multi-head self-attention", "attn", width=0.5)
    _lab04_arrow(ax, [(branch, 0.315), (branch, 0.4), (c + 0.022, 0.4)])
    _lab04_arrow(ax, [(c, 0.48), (branch, 0.48), (branch, 0.525)])
    _lab04_box(ax, branch, 0.56, "LayerNorm 2", "norm", width=0.5)
    _lab04_arrow(ax, [(branch, 0.595), (branch, 0.645)])
    _lab04_box(ax, branch, 0.68, "feed-forward", "ff", width=0.5)
    _lab04_arrow(ax, [(branch, 0.715), (branch, 0.8), (c + 0.022, 0.8)])
    ax.text(c, 0.0, "x  (B, T, D)", ha="center", va="bottom", fontsize=8.5)
    ax.text(
        c,
        0.965,
        "to the next block\n(a final LayerNorm after the last one)",
        ha="center",
        va="bottom",
        fontsize=8.5,
    )
    ax.text(c - 0.03, 0.6, "residual\nstream", color=res, ha="right", va="center", fontsize=8)
    ax.text(
        0.5,
        -0.07,
        "x = x + SelfAttention(LayerNorm1(x))\nx = x + FF(LayerNorm2(x))",
        ha="center",
        va="top",
        fontsize=8.5,
        family="monospace",
    )


def encoder_block_diagram() -> Figure:
    """The encoder block two ways: post-norm ("Add & Norm", the lecture) and pre-norm.

    Left, post-norm (``norm_first=False``): the residual path (red) adds each sub-layer's input
    to its output and the sum is layer-normalised, so the signal that reaches the next block
    has passed through a norm after every sub-layer. Right, pre-norm (``norm_first=True``, GPT-2
    onwards): each sub-layer reads a normalised copy of the residual stream and adds its output
    back; the stream itself (red) runs from the input to the output untouched, which is why a
    pre-norm stack needs one final LayerNorm after its last block.

    Returns:
        A figure with two panels (no pyplot: it also works headless).

    Reference: Prince, *Understanding Deep Learning*, section 12.4; Xiong et al.,
    "On Layer Normalization in the Transformer Architecture" (2020), figure 1.
    """
    fig = Figure(figsize=(9.0, 5.6), layout="constrained")
    left, right = fig.subplots(1, 2)
    for ax, draw, title in (
        (left, _lab04_post_norm, "post-norm, norm_first=False\n(Add & Norm, as in the lecture)"),
        (right, _lab04_pre_norm, "pre-norm, norm_first=True\n(GPT-2 and most large models)"),
    ):
        ax.set_xlim(0, 1)
        ax.set_ylim(-0.2, 1.1)
        ax.set_axis_off()
        ax.set_title(title, fontsize=10)
        draw(ax)
    return fig


# --------------------------------------------------------------------------------------
# Lab 05: masking
# --------------------------------------------------------------------------------------


__all__ += ["loss_race", "mask_grid", "weight_grid"]


def _grid_axes(n: int, cell: float, rows_cols: tuple[int, int]) -> tuple[Figure, list[Axes]]:
    """A figure with ``n`` panels side by side, each sized for a ``rows x cols`` table."""
    rows, cols = rows_cols
    width = max(2.2, cell * cols + 1.0)
    height = max(2.0, cell * rows + 1.0)
    fig = Figure(figsize=(width * n, height), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False)[0]
    return fig, list(axes)


def _label_axes(
    ax: Axes,
    shape: tuple[int, int],
    row_labels: Sequence[str] | None,
    col_labels: Sequence[str] | None,
    ylabel: str,
    xlabel: str,
) -> None:
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
    fig, axes = _grid_axes(len(panels), 0.38, shape)
    colours = ListedColormap(["#f2f2f2", "#2c7fb8"])
    for i, (ax, (title, t)) in enumerate(zip(axes, panels, strict=True)):
        ax.imshow(t.to(torch.bool).numpy(), cmap=colours, vmin=0, vmax=1)
        rows = row_labels[i] if row_labels else None
        cols = col_labels[i] if col_labels else None
        _label_axes(ax, tuple(t.shape), rows, cols, ylabel, xlabel)
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
    fig, axes = _grid_axes(len(panels), 0.5, shape)
    image = None
    for i, (ax, (title, t)) in enumerate(zip(axes, panels, strict=True)):
        w = t.float()
        shown = np.ma.masked_equal(w.numpy(), 0.0)
        image = ax.imshow(shown, cmap="viridis", vmin=0.0, vmax=1.0)
        ax.set_facecolor("#f2f2f2")
        rows = row_labels[i] if row_labels else None
        cols = col_labels[i] if col_labels else rows
        _label_axes(ax, tuple(w.shape), rows, cols, "query", "key")
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


# --------------------------------------------------------------------------------------
# Lab 06: the encoder-decoder
# --------------------------------------------------------------------------------------

__all__ += ["encoder_decoder_diagram", "teacher_forcing_diagram"]

_SOURCE = ("the", "big", "men", "ate", "a", "fish")
_TARGET = ("tori", "gran", "li", "pesk", "un", "mangon")


def _box(
    ax: Axes, x: float, y: float, w: float, h: float, text: str, color: str, **kw: Any
) -> None:
    """A rounded box centred on ``(x, y)`` with ``text`` inside (the block diagrams' boxes)."""
    ax.add_patch(
        FancyBboxPatch(
            (x - w / 2, y - h / 2),
            w,
            h,
            boxstyle="round,pad=0.02,rounding_size=0.08",
            facecolor=color,
            edgecolor="0.25",
            linewidth=1.0,
        )
    )
    ax.text(x, y, text, ha="center", va="center", fontsize=kw.pop("fontsize", 9), **kw)


def _flow_arrow(ax: Axes, start: tuple[float, float], end: tuple[float, float], **kw: Any) -> None:
    ax.annotate(
        "",
        xy=end,
        xytext=start,
        arrowprops={"arrowstyle": "->", "color": kw.pop("color", "0.2"), "lw": 1.2, **kw},
    )


def _lab06_tokens(
    ax: Any, words: Sequence[str], x0: float, x1: float, y: float, color: str
) -> list[float]:
    """Words evenly spaced between ``x0`` and ``x1`` at height ``y``; their x positions."""
    step = (x1 - x0) / max(1, len(words) - 1)
    xs = [x0 + i * step for i in range(len(words))]
    for x, word in zip(xs, words, strict=True):
        _box(ax, x, y, 0.62, 0.32, word, color, fontsize=8)
    return xs


def encoder_decoder_diagram() -> Figure:
    """The encoder-decoder of the lecture (Prince, section 12.8) with the decoder's two inputs.

    The encoder reads the source once; its output, the *memory*, is the keys and values of every
    decoder block's cross-attention. The decoder reads the target shifted right (BOS first) and
    its masked self-attention lets position ``t`` see positions ``<= t`` only; its cross-attention
    takes queries from the decoder. A linear layer and a softmax over the target vocabulary give
    the next word at every position.
    """
    fig = Figure(figsize=(10.5, 6.2), layout="constrained")
    ax = fig.subplots()
    ax.set_xlim(-0.2, 10.4)
    ax.set_ylim(-0.6, 7.6)
    ax.axis("off")
    enc, dec = "#dbe9f6", "#fde2c8"
    # Encoder (left).
    src_x = _lab06_tokens(ax, _SOURCE, 0.4, 4.0, 0.0, "white")
    _box(ax, 2.2, 1.3, 4.2, 0.6, "embedding + positions", "0.95")
    _box(ax, 2.2, 2.5, 4.2, 0.7, "self-attention (every source word sees every other)", enc)
    _box(ax, 2.2, 3.5, 4.2, 0.6, "feed-forward", enc)
    ax.text(4.45, 3.0, "x N", fontsize=9, va="center")
    _box(ax, 2.2, 4.8, 4.2, 0.6, "memory  (S, D): one vector per source word", "#b7d3ee")
    for x in src_x:
        _flow_arrow(ax, (x, 0.17), (x, 0.98))
    for y0, y1 in ((1.6, 2.15), (2.85, 3.2), (3.8, 4.5)):
        _flow_arrow(ax, (2.2, y0), (2.2, y1))
    ax.text(2.2, -0.45, "source: English, read all at once", ha="center", fontsize=9)
    # Decoder (right).
    tgt_x = _lab06_tokens(ax, ("<bos>", *_TARGET[:-1]), 5.8, 9.9, 0.0, "white")
    _box(ax, 7.85, 1.3, 4.4, 0.6, "embedding + positions", "0.95")
    _box(ax, 7.85, 2.4, 4.4, 0.7, "MASKED self-attention (position t sees 0..t)", dec)
    _box(
        ax,
        7.85,
        3.5,
        4.4,
        0.7,
        "cross-attention: Q from the decoder,\nK and V from the memory",
        dec,
    )
    _box(ax, 7.85, 4.55, 4.4, 0.55, "feed-forward", dec)
    ax.text(10.12, 3.4, "x N", fontsize=9, va="center")
    _box(ax, 7.85, 5.5, 4.4, 0.55, "linear: D -> V, softmax over the vocabulary", "#f6c89f")
    for x in tgt_x:
        _flow_arrow(ax, (x, 0.17), (x, 0.98))
    for y0, y1 in ((1.6, 2.05), (2.75, 3.15), (3.85, 4.27), (4.83, 5.22)):
        _flow_arrow(ax, (7.85, y0), (7.85, y1))
    _flow_arrow(ax, (4.3, 4.8), (5.65, 3.6), color="#2b6cb0", connectionstyle="arc3,rad=-0.2")
    ax.text(4.55, 4.35, "keys, values", color="#2b6cb0", fontsize=8, rotation=-28)
    out_x = _lab06_tokens(ax, (*_TARGET, "<eos>")[: len(tgt_x)], 5.8, 9.9, 6.6, "#fff4e6")
    for x in out_x:
        _flow_arrow(ax, (x, 5.78), (x, 6.43))
    ax.text(
        7.85,
        7.2,
        "predicted next words (the targets: the input shifted left)",
        ha="center",
        fontsize=9,
    )
    ax.text(
        7.85, -0.45, "decoder input: the target shifted right, BOS first", ha="center", fontsize=9
    )
    ax.text(
        2.2,
        5.6,
        "every sub-layer is followed by Add & Norm: x = norm(x + sublayer(x))",
        ha="center",
        fontsize=8,
        color="0.35",
    )
    return fig


def teacher_forcing_diagram(n: int = 4) -> Figure:
    """Training reads the whole shifted target in one pass; generation needs one pass per word.

    Left: teacher forcing. The decoder gets ``BOS y_1 .. y_{n-1}`` and predicts ``y_1 .. y_n``
    at all positions at once; the causal mask (the triangle) keeps position ``t`` from seeing
    ``y_{t+1}``. Right: greedy generation. Each pass appends the argmax of the last position
    and feeds it back, so ``n`` words need ``n`` passes, one after the other.

    Args:
        n: number of target words shown.
    """
    fig = Figure(figsize=(10.5, 4.2), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=[1.0, 1.35])
    words = _TARGET[:n]
    inputs = ("<bos>", *words[:-1])
    for ax in (left, right):
        ax.axis("off")
    # Teacher forcing: one pass.
    left.set_xlim(-0.6, n + 0.4)
    left.set_ylim(-1.0, 4.3)
    left.set_title("training (teacher forcing): ONE pass", fontsize=10)
    for i, (w_in, w_out) in enumerate(zip(inputs, words, strict=True)):
        _box(left, i + 0.5, 0.0, 0.85, 0.4, w_in, "white", fontsize=8)
        _box(left, i + 0.5, 3.2, 0.85, 0.4, w_out, "#fff4e6", fontsize=8)
        _flow_arrow(left, (i + 0.5, 0.22), (i + 0.5, 0.75))
        _flow_arrow(left, (i + 0.5, 2.45), (i + 0.5, 2.98))
        left.text(i + 0.5, 3.65, "loss", ha="center", fontsize=7, color="0.35")
    _box(left, n / 2, 1.65, n + 0.1, 1.7, "", "#fde2c8")
    for t in range(n):  # the causal mask: query t (row) may see keys 0..t
        for s in range(n):
            color = "#c05621" if s <= t else "white"
            left.add_patch(_square(n / 2 - 0.6 + 0.3 * s, 2.15 - 0.3 * t, 0.28, color))
    left.text(
        n / 2, 0.98, "decoder; its causal mask (query t sees keys 0..t)", ha="center", fontsize=8
    )
    left.text(n / 2, -0.7, "decoder input = targets shifted right", ha="center", fontsize=8)
    # Generation: one pass per word.
    right.set_xlim(-0.3, n * 1.35)
    right.set_ylim(-0.8, n + 0.6)
    right.set_title("generation (greedy): one pass PER WORD, in order", fontsize=10)
    for step in range(n):
        y = n - 1 - step
        right.text(-0.2, y, f"pass {step + 1}", fontsize=8, va="center")
        for i, w in enumerate(inputs[: step + 1]):
            _box(right, 1.0 + 0.8 * i, y, 0.72, 0.36, w, "white", fontsize=7)
        x_out = 1.0 + 0.8 * (step + 1) + 0.5
        _flow_arrow(right, (1.0 + 0.8 * step + 0.4, y), (x_out - 0.38, y))
        _box(right, x_out, y, 0.72, 0.36, words[step], "#fff4e6", fontsize=7)
        if step < n - 1:
            _flow_arrow(right, (x_out, y - 0.2), (1.0 + 0.8 * (step + 1), y - 0.8), color="#2b6cb0")
    right.text(
        n * 0.65,
        -0.65,
        "each argmax is fed back: word t + 1 cannot start before word t exists",
        ha="center",
        fontsize=8,
        color="#2b6cb0",
    )
    return fig


def _square(x: float, y: float, size: float, color: str) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), size, size, facecolor=color, edgecolor="0.4", linewidth=0.5)


# --------------------------------------------------------------------------------------
# Lab 07: the NLP pipeline
# --------------------------------------------------------------------------------------

__all__ += ["beam_tree", "bpe_merges_figure", "decoding_distributions", "one_hot_lookup"]

# Piece colours of the BPE figure (cycled), and the end-of-word symbol as drawn (the book's "_").
_LAB07_PIECES = ("#c6dbef", "#fdd0a2", "#c7e9c0", "#dadaeb", "#fcbba1", "#fff2b3")
_LAB07_EOW = "</w>"


def _lab07_shown(piece: str) -> str:
    return piece.replace(_LAB07_EOW, "_")


def bpe_merges_figure(
    words: Sequence[str], steps: Sequence[Sequence[Sequence[str]]], labels: Sequence[str]
) -> Figure:
    """How byte-pair encoding cuts a few words after each merge: one row per step.

    Each piece is a box as wide as its characters; the end-of-word symbol ``</w>`` is drawn as
    ``_`` (the book's mark for a word boundary).

    Args:
        words: the words shown, one column each.
        steps: ``steps[s][w]`` the pieces of word ``w`` after step ``s`` (e.g. the output of
            ``bpe_encode(word, merges[:k])``).
        labels: one label per step, e.g. ``"3 merges: + (s, e)"``.

    Returns:
        The figure.
    """
    if len(steps) != len(labels):
        raise ValueError(f"{len(steps)} steps but {len(labels)} labels")
    widths = [max(len(_lab07_shown("".join(step[w]))) for step in steps) for w in range(len(words))]
    total = sum(widths) + 1.5 * (len(words) - 1)
    fig = Figure(figsize=(2.6 + 0.32 * total, 0.42 * len(steps) + 0.8), layout="constrained")
    ax = fig.subplots()
    for row, step in enumerate(steps):
        y = -row
        ax.text(-0.6, y, labels[row], ha="right", va="center", fontsize=8)
        x0 = 0.0
        for w, pieces in enumerate(step):
            x = x0
            for k, piece in enumerate(pieces):
                shown = _lab07_shown(piece)
                colour = _LAB07_PIECES[k % len(_LAB07_PIECES)] if len(shown) > 1 else "white"
                ax.add_patch(
                    Rectangle((x, y - 0.38), len(shown), 0.76, facecolor=colour, edgecolor="0.3")
                )
                ax.text(x + len(shown) / 2, y, shown, ha="center", va="center", fontsize=8,
                        family="monospace")  # fmt: skip
                x += len(shown)
            x0 += widths[w] + 1.5
    x0 = 0.0
    for w, word in enumerate(words):
        ax.text(x0 + widths[w] / 2, 0.75, word, ha="center", va="bottom", fontsize=9)
        x0 += widths[w] + 1.5
    ax.set_xlim(-0.5, total + 0.5)
    ax.set_ylim(-len(steps) + 0.4, 1.4)
    ax.axis("off")
    ax.set_title("BPE merges, step by step (boxes: tokens; _ marks the end of a word)", fontsize=10)
    return fig


def one_hot_lookup(ids: Sequence[int], tokens: Sequence[str], weight: Tensor) -> Figure:
    """An embedding lookup as a product: ``one_hot(ids) (N, V) @ E (V, D) = E[ids] (N, D)``.

    Args:
        ids: the token ids of a short text, ``N`` of them.
        tokens: what each id stands for (labels of the rows).
        weight: the embedding matrix ``E``, ``(V, D)``.

    Returns:
        The figure: three panels, the rows of ``E`` that are used outlined.
    """
    E = weight.detach().float().cpu()
    V, D = E.shape
    onehot = torch.zeros(len(ids), V)
    onehot[torch.arange(len(ids)), torch.as_tensor(list(ids))] = 1.0
    out = onehot @ E  # (N, D)
    cell = 0.22
    fig = Figure(
        figsize=(cell * (V + 2 * D) + 2.5, cell * max(V, len(ids)) + 1.4), layout="constrained"
    )
    axes = fig.subplots(1, 3, width_ratios=[V, D, D])
    limit = float(E.abs().max())
    axes[0].imshow(onehot, cmap="Greys", vmin=0, vmax=1)
    axes[0].set(title=f"one-hot ids ({len(ids)} x {V})", xlabel="token id")
    axes[0].set_yticks(range(len(ids)), [repr(t) for t in tokens], fontsize=7)
    axes[1].imshow(E, cmap="RdBu", vmin=-limit, vmax=limit)
    axes[1].set(title=f"@ E ({V} x {D})", xlabel="feature", ylabel="token id")
    for i in sorted({int(i) for i in ids}):
        axes[1].add_patch(
            Rectangle((-0.5, i - 0.5), D, 1, fill=False, edgecolor=_HIGHLIGHT, linewidth=1.5)
        )
    axes[2].imshow(out, cmap="RdBu", vmin=-limit, vmax=limit)
    axes[2].set(title=f"= E[ids] ({len(ids)} x {D})", xlabel="feature")
    axes[2].set_yticks(range(len(ids)), [repr(t) for t in tokens], fontsize=7)
    return fig


def decoding_distributions(panels: Mapping[str, Tensor], labels: Sequence[str]) -> Figure:
    """Next-token probabilities under several decoding rules, one bar chart per rule.

    Args:
        panels: title -> probabilities ``(V,)`` (0 where a filter removed the token).
        labels: the tokens, ``V`` of them.

    Returns:
        The figure; removed tokens are marked with an ``x`` on the axis.
    """
    fig = Figure(figsize=(3.2 * len(panels), 3.0), layout="constrained")
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    for ax, (title, probs) in zip(axes, panels.items(), strict=True):
        p = probs.detach().double().cpu()
        ax.bar(range(len(p)), p, color=["#4c72b0" if v > 0 else "0.85" for v in p.tolist()])
        for i, v in enumerate(p.tolist()):
            if v == 0:
                ax.text(i, 0.01, "x", ha="center", va="bottom", color="0.4", fontsize=8)
        ax.set_xticks(range(len(p)), list(labels), rotation=60, fontsize=7)
        ax.set_title(title, fontsize=9)
    axes[0].set_ylabel("probability of the next token")
    return fig


def beam_tree(
    table: Mapping[tuple[int, ...], Sequence[float]],
    words: Sequence[str],
    paths: Mapping[str, Sequence[int]],
    *,
    eos_id: int = 1,
    min_prob: float = 0.1,
) -> Figure:
    """The search tree of a hand-built next-token table, with chosen hypotheses in colour.

    Args:
        table: prefix (tuple of ids, BOS first) -> probabilities of the next token.
        words: the token of each id.
        paths: label -> a hypothesis (ids, BOS first), e.g. what greedy decoding and a beam of
            width 2 return.
        eos_id: the end token (a leaf).
        min_prob: edges less likely than this are left out (unless on a path).

    Returns:
        The figure: one node per prefix, edges labelled with their probability.
    """
    on_path = {tuple(p[: i + 1]) for p in paths.values() for i in range(len(p))}
    children: dict[tuple[int, ...], list[tuple[int, float]]] = {}
    for prefix, probs in table.items():
        kept = [
            (tok, float(q))
            for tok, q in enumerate(probs)
            if q >= min_prob or (*prefix, tok) in on_path
        ]
        children[tuple(prefix)] = sorted(kept, key=lambda c: -c[1])
    root = min(children, key=len)
    y_of: dict[tuple[int, ...], float] = {}
    leaves = 0

    def place(node: tuple[int, ...]) -> float:
        nonlocal leaves
        kids = [(*node, tok) for tok, _ in children.get(node, [])] if node[-1] != eos_id else []
        if not kids or (node != root and node not in children):
            y_of[node] = -float(leaves)
            leaves += 1
            return y_of[node]
        ys = [place(kid) for kid in kids]
        y_of[node] = sum(ys) / len(ys)
        return y_of[node]

    place(root)
    depth = max(len(n) for n in y_of)
    fig = Figure(figsize=(2.0 + 2.2 * depth, 0.34 * leaves + 1.2), layout="constrained")
    ax = fig.subplots()
    colours = ["#d62728", "#2ca02c", "#1f77b4", "#9467bd"]
    path_edges = {
        label: {tuple(p[: i + 1]) for i in range(1, len(p))} for label, p in paths.items()
    }
    for node, y in y_of.items():
        x = len(node) - 1
        ax.text(x, y, words[node[-1]], ha="center", va="center", fontsize=8,
                bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "0.5"})  # fmt: skip
        if len(node) > 1:
            parent = node[:-1]
            q = dict(children[parent])[node[-1]]
            used = [k for k, (label, edges) in enumerate(path_edges.items()) if node in edges]
            colour = colours[used[0] % len(colours)] if used else "0.75"
            ax.plot([x - 1 + 0.18, x - 0.18], [y_of[parent], y], color=colour,
                    lw=2.5 if used else 0.8, zorder=0)  # fmt: skip
            ax.text(x - 0.5, (y_of[parent] + y) / 2 + 0.12, f"{q:g}", ha="center", fontsize=7,
                    color=colour if used else "0.4")  # fmt: skip
    for k, label in enumerate(paths):
        ax.plot([], [], color=colours[k % len(colours)], lw=2.5, label=label)
    ax.legend(loc="lower left", fontsize=8, frameon=False)
    ax.set_xlim(-0.5, depth - 0.5)
    ax.set_ylim(-leaves - 0.5, 0.8)
    ax.axis("off")
    ax.set_title(f"the search tree (edges with probability >= {min_prob:g}, and the paths)")
    return fig


# --------------------------------------------------------------------------------------
# Lab 08: language models
# --------------------------------------------------------------------------------------

__all__ += ["dependency_grid", "gpt_diagram", "kv_cache_diagram", "scale_chart"]

_LAB08_COLOURS = {
    "embed": "#e8e8e8",
    "attn": "#fde2c8",
    "mlp": "#dbe9f6",
    "norm": "#f2f2f2",
    "head": "#f6c89f",
    "computed": "#e07b39",
    "cached": "#7fb77e",
}


def gpt_diagram(columns: Mapping[str, Mapping[str, str]] | None = None) -> Figure:
    """The decoder-only Transformer of GPT-2 and GPT-3 (Prince, section 12.7), and its sizes.

    Left: token ids become token embeddings plus learned position embeddings; ``L`` pre-norm
    blocks (layer norm, masked multi-head self-attention with one fused q/k/v projection, a
    residual sum; layer norm, an MLP ``D -> 4D -> D`` with GELU, a residual sum); a final layer
    norm; the output layer, which shares its matrix with the token embedding, and a softmax
    that gives the next token's probabilities at every position. Right: a table of sizes, one
    column per model (for example this lab's character model and GPT-3).

    Args:
        columns: column title -> row name -> value, e.g.
            ``{"this lab": {"layers L": "4", ...}, "GPT-3": {...}}``; None draws the stack only.
    """
    fig = Figure(figsize=(11.5 if columns else 6.5, 7.0), layout="constrained")
    if columns:
        ax, table_ax = fig.subplots(1, 2, width_ratios=[1.25, 1.0])
    else:
        ax, table_ax = fig.subplots(), None
    c = _LAB08_COLOURS
    box = functools.partial(_box, fontsize=8.5)  # (ax, x, y, w, h, text, colour)
    arrow = functools.partial(_flow_arrow, lw=1.0)  # (ax, start, end)
    ax.set_xlim(-0.3, 6.6)
    ax.set_ylim(-0.6, 10.2)
    ax.axis("off")
    for i, word in enumerate(("To", "be", ",", "or")):
        x = 1.2 + 1.2 * i
        ax.text(x, -0.35, word, ha="center", fontsize=9, family="monospace")
        arrow(ax, (x, -0.12), (x, 0.45))
    box(
        ax,
        3.0,
        0.8,
        5.2,
        0.6,
        "token embedding (V x D) + position embedding (n_ctx x D)",
        c["embed"],
    )
    # One block, drawn once and repeated L times: the residual stream on the left, two branches.
    ax.add_patch(
        FancyBboxPatch(
            (0.35, 1.4),
            5.55,
            5.75,
            boxstyle="round,pad=0.02,rounding_size=0.1",
            facecolor="white",
            edgecolor="0.5",
            linestyle="--",
        )
    )
    ax.text(6.1, 4.3, "x L blocks", rotation=90, va="center", fontsize=9)
    stream = 1.0
    ax.plot([stream, stream], [1.1, 7.6], color="0.35", lw=1.4)
    ax.text(0.7, 2.6, "residual stream", rotation=90, fontsize=7, color="0.4", va="center")
    for y_split, y_norm, y_layer, y_plus, text, colour, height in (
        (
            1.7,
            2.15,
            3.05,
            3.95,
            "masked multi-head self-attention\nqkv_proj: D -> 3D, H heads of D/H,\n"
            "causal mask, out_proj: D -> D",
            c["attn"],
            0.95,
        ),
        (4.45, 4.9, 5.75, 6.6, "MLP: D -> 4D, GELU, 4D -> D", c["mlp"], 0.7),
    ):
        ax.plot([stream, 3.6, 3.6], [y_split, y_split, y_norm - 0.22], color="0.35", lw=1.0)
        arrow(ax, (3.6, y_norm - 0.25), (3.6, y_norm - 0.2))
        box(ax, 3.6, y_norm, 3.0, 0.42, "layer norm", c["norm"])
        arrow(ax, (3.6, y_norm + 0.21), (3.6, y_layer - height / 2))
        box(ax, 3.6, y_layer, 4.1, height, text, colour)
        ax.plot([3.6, 3.6], [y_layer + height / 2, y_plus], color="0.35", lw=1.0)
        arrow(ax, (3.6, y_plus), (stream + 0.22, y_plus))
        box(ax, stream, y_plus, 0.42, 0.42, "+", "white", fontsize=11)
    ax.plot([stream, 3.0], [7.6, 7.6], color="0.35", lw=1.4)
    arrow(ax, (3.0, 7.6), (3.0, 7.72))
    box(ax, 3.0, 7.95, 3.2, 0.45, "final layer norm", c["norm"])
    box(
        ax,
        3.0,
        8.85,
        4.8,
        0.65,
        "output layer D -> V (the token embedding, transposed: tied)",
        c["head"],
    )
    arrow(ax, (3.0, 8.18), (3.0, 8.52))
    arrow(ax, (3.0, 9.18), (3.0, 9.55))
    ax.text(3.0, 9.8, "softmax: Pr(next token) at every position", ha="center", fontsize=9)
    if table_ax is not None and columns:
        table_ax.axis("off")
        names = list(columns)
        rows = list(dict.fromkeys(r for col in columns.values() for r in col))
        cells = [[columns[n].get(r, "") for n in names] for r in rows]
        table = table_ax.table(
            cellText=cells,
            rowLabels=rows,
            colLabels=names,
            cellLoc="right",
            bbox=[0.25, 0.3, 0.75, 0.06 * (len(rows) + 1)],
        )
        table.auto_set_font_size(False)
        table.set_fontsize(9)
        table_ax.text(
            0.6,
            0.33 + 0.06 * (len(rows) + 1),
            "the same layout at two sizes",
            ha="center",
            fontsize=10,
        )
    return fig


def kv_cache_diagram(prompt: int = 3, new: int = 6) -> Figure:
    """The work of generating ``new`` tokens after a prompt, without and with a KV cache.

    Each row is one step of generation, each column a position. Without a cache, every step
    runs the model over all the positions so far (orange): the work grows like a triangle. With
    a cache the prompt is run once; then each step computes one position, the new token, whose
    query reads the keys and values of the earlier positions from the cache (green) instead of
    recomputing them. What the cache stores per position: a key and a value per layer.

    Args:
        prompt: tokens of the prompt.
        new: tokens generated.
    """
    if prompt < 1 or new < 1:
        raise ValueError(f"prompt={prompt} and new={new} must be >= 1")
    steps, width = new, prompt + new - 1
    fig = Figure(figsize=(11.0, 0.55 * steps + 2.0), layout="constrained")
    axes = fig.subplots(1, 2)
    c = _LAB08_COLOURS
    totals = []
    for ax, cached in zip(axes, (False, True), strict=True):
        computed = 0
        for step in range(steps):
            known = prompt + step  # positions the model needs at this step
            for pos in range(width):
                if pos >= known:
                    colour = "white"
                elif not cached or (step == 0) or pos == known - 1:
                    colour = c["computed"]
                    computed += 1
                else:
                    colour = c["cached"]
                ax.add_patch(_square(pos, steps - 1 - step, 0.9, colour))
        totals.append(computed)
        ax.set_xlim(-0.3, width + 0.2)
        ax.set_ylim(-0.3, steps + 0.2)
        ax.set_aspect("equal")
        ax.set_xticks([p + 0.45 for p in range(width)], [str(p) for p in range(width)])
        ax.set_yticks(
            [steps - 1 - s + 0.45 for s in range(steps)],
            [f"writes token {prompt + s}" for s in range(steps)],
        )
        ax.tick_params(length=0, labelsize=8)
        for side in ax.spines.values():
            side.set_visible(False)
        ax.set_xlabel("position")
    axes[0].set_title(
        f"without a cache: every step recomputes every position ({totals[0]} in all)", fontsize=10
    )
    axes[1].set_title(
        f"with a KV cache: the prompt once, then one position per step ({totals[1]})",
        fontsize=10,
    )
    axes[1].text(
        width / 2,
        -1.1,
        "green: keys and values read from the cache (2 vectors of width D per layer and position)",
        ha="center",
        fontsize=8,
        color="0.3",
    )
    return fig


def dependency_grid(tables: Mapping[str, Tensor], labels: Sequence[str] | None = None) -> Figure:
    """How much each output position depends on each input position, one panel per table.

    A table ``(T, T)`` holds, in row ``t`` and column ``s``, the size of the change of output
    ``t`` with input ``s`` (for example the norm of a Jacobian block). Each row is scaled to its
    largest entry; exact zeros stay white, so a causal map shows an empty upper triangle.

    Args:
        tables: title -> ``(T, T)`` table (rows: outputs, columns: inputs).
        labels: names of the positions (tokens), for the axes.

    Raises:
        ValueError: if a table is not square or nothing is given.
    """
    if not tables:
        raise ValueError("dependency_grid: nothing to draw")
    fig = Figure(figsize=(4.2 * len(tables), 4.2), layout="constrained")
    axes = fig.subplots(1, len(tables), squeeze=False)[0]
    for ax, (title, table) in zip(axes, tables.items(), strict=True):
        t = table.detach().to("cpu", torch.float64)
        if t.ndim != 2 or t.shape[0] != t.shape[1]:
            raise ValueError(f"dependency_grid: {title!r} has shape {tuple(t.shape)}, not (T, T)")
        top = t.abs().amax(dim=1, keepdim=True).clamp_min(1e-300)
        shown = np.ma.masked_where(t.numpy() == 0.0, (t.abs() / top).numpy())
        ax.imshow(shown, cmap="viridis", vmin=0.0, vmax=1.0)
        ticks = list(range(t.shape[0]))
        names = list(labels) if labels is not None else [str(i) for i in ticks]
        ax.set_xticks(ticks, names, rotation=90, fontsize=8)
        ax.set_yticks(ticks, names, fontsize=8)
        ax.set_xlabel("input position s")
        ax.set_ylabel("output position t")
        zeros = int((t == 0).sum())
        ax.set_title(f"{title}\n({zeros} exact zeros, white)", fontsize=9)
    return fig


def scale_chart(points: Sequence[Mapping[str, Any]]) -> Figure:
    """Parameters and training compute against the model width, log-log, one line per family.

    Args:
        points: one mapping per model with ``family``, ``label``, ``d_model``, ``params``
            (recomputed), optionally ``published`` (the paper's count, drawn hollow) and
            ``flops`` (training compute; None where the training tokens are unknown).

    Returns:
        A figure with two panels: parameters, and training FLOPs.

    Raises:
        ValueError: if ``points`` is empty.
    """
    if not points:
        raise ValueError("scale_chart: nothing to draw")
    fig = Figure(figsize=(11.5, 4.6), layout="constrained")
    left, right = fig.subplots(1, 2)
    families = list(dict.fromkeys(p["family"] for p in points))
    markers = "osD^v"
    for i, family in enumerate(families):
        rows = sorted((p for p in points if p["family"] == family), key=lambda p: p["d_model"])
        colour = f"C{i}"
        xs = [p["d_model"] for p in rows]
        left.plot(
            xs, [p["params"] for p in rows], marker=markers[i % 5], color=colour, label=family
        )
        published = [(p["d_model"], p["published"]) for p in rows if p.get("published")]
        if published:
            left.scatter(
                *zip(*published, strict=True), s=90, facecolors="none", edgecolors=colour, lw=1.2
            )
        with_flops = [(p["d_model"], p["flops"]) for p in rows if p.get("flops")]
        if with_flops:
            right.plot(
                *zip(*with_flops, strict=True), marker=markers[i % 5], color=colour, label=family
            )
        for p in rows:
            if len(rows) <= 2 or p is rows[-1] or p is rows[0]:
                left.annotate(
                    p["label"],
                    (p["d_model"], p["params"]),
                    fontsize=7,
                    xytext=(4, -10),
                    textcoords="offset points",
                )
                if p.get("flops"):
                    right.annotate(
                        p["label"],
                        (p["d_model"], p["flops"]),
                        fontsize=7,
                        xytext=(4, -10),
                        textcoords="offset points",
                    )
    for ax, what in (
        (left, "parameters (hollow: as published)"),
        (right, "training FLOPs (6 N D)"),
    ):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("model width d_model")
        ax.set_title(what, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    return fig
