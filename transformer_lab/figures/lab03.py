"""Lab 03's diagrams: multi-head attention's split into heads and merge back, and heads' maps.

* :func:`head_split_diagram`: one sequence through ``split_heads``, attention in every head and
  ``merge_heads``, with the shape at each step and the cells coloured by head;
* :func:`split_merge_figure`: where every entry of ``x`` went after a student's split and merge;
* :func:`query_rows_by_head`: where one query looks, head by head, in several sentences.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from torch import Tensor

from transformer_lab.figures.draw import arrow, grid

__all__ = ["head_split_diagram", "query_rows_by_head", "split_merge_figure"]


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


def _caption(ax: Axes, x: float, top: float, cols: int, text: str) -> None:
    """A small title above a grid of ``cols`` unit cells whose top-left corner is ``(x, top)``."""
    ax.text(x + cols / 2, top + 0.35, text, ha="center", va="bottom", fontsize=8)


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

    def step(x0: float, x1: float, text: str) -> None:  # an arrow along the middle, labelled
        arrow(ax, [(x0, y_mid), (x1, y_mid)], colour="black", label=text)

    grid(ax, x, y_mid + T / 2, T, D, by_feature)
    _caption(ax, x, y_mid + T / 2, D, f"x: (B, T, D) = (B, {T}, {D})")
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
    step(x + 0.3, x + gap - 0.3, "split_heads:\nview (B, T, H, Dh)\ntranspose(1, 2)")
    x += gap
    for h in range(H):
        y = top - h * (T + 0.6)
        grid(ax, x, y, T, dh, lambda i, j, h=h: _head_colour(h, i, T))
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
    step(x, x + gap, "in every head:\nsoftmax(q k^T / sqrt(Dh)) v\n(B, H, T, T) weights")
    x += gap + 0.3
    for h in range(H):
        y = top - h * (T + 0.6)
        grid(ax, x, y, T, dh, lambda i, j, h=h: (*_head_colour(h, i, T), 0.55))
    ax.text(
        x + dh / 2,
        top + 0.35,
        "heads' outputs\n(B, H, T, Dh)",
        ha="center",
        va="bottom",
        fontsize=8,
    )
    x += dh + 0.3
    step(x + 0.3, x + gap - 0.3, "merge_heads:\ntranspose(1, 2)\nreshape (B, T, D)")
    x += gap
    grid(ax, x, y_mid + T / 2, T, D, lambda i, j: (*by_feature(i, j), 0.55))
    _caption(ax, x, y_mid + T / 2, D, f"concatenated: (B, T, D) = (B, {T}, {D})")
    x += D
    step(x + 0.3, x + gap - 0.3, "out_proj\n(D, D):\nmixes heads")
    x += gap
    grid(ax, x, y_mid + T / 2, T, D, lambda i, j: (0.45 + 0.1 * i / T,) * 3)
    _caption(ax, x, y_mid + T / 2, D, "out: (B, T, D)")
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
