"""Lab 06's diagrams: the encoder-decoder with the decoder's two inputs, and teacher forcing.

* :func:`encoder_decoder_diagram`: the encoder's memory feeding every decoder block's
  cross-attention, the target shifted right as the decoder's input;
* :func:`teacher_forcing_diagram`: one training pass over the whole shifted target beside
  greedy generation's one pass per word.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure

from transformer_lab.figures.draw import arrow, box, grid

__all__ = ["encoder_decoder_diagram", "teacher_forcing_diagram"]


_SOURCE = ("the", "big", "men", "ate", "a", "fish")
_TARGET = ("tori", "gran", "li", "pesk", "un", "mangon")


def _lab06_tokens(
    ax: Any, words: Sequence[str], x0: float, x1: float, y: float, color: str
) -> list[float]:
    """Words evenly spaced between ``x0`` and ``x1`` at height ``y``; their x positions."""
    step = (x1 - x0) / max(1, len(words) - 1)
    xs = [x0 + i * step for i in range(len(words))]
    for x, word in zip(xs, words, strict=True):
        box(ax, x, y, 0.62, 0.32, word, color, fontsize=8)
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
    box(ax, 2.2, 1.3, 4.2, 0.6, "embedding + positions", "0.95")
    box(ax, 2.2, 2.5, 4.2, 0.7, "self-attention (every source word sees every other)", enc)
    box(ax, 2.2, 3.5, 4.2, 0.6, "feed-forward", enc)
    ax.text(4.45, 3.0, "x N", fontsize=9, va="center")
    box(ax, 2.2, 4.8, 4.2, 0.6, "memory  (S, D): one vector per source word", "#b7d3ee")
    for x in src_x:
        arrow(ax, [(x, 0.17), (x, 0.98)])
    for y0, y1 in ((1.6, 2.15), (2.85, 3.2), (3.8, 4.5)):
        arrow(ax, [(2.2, y0), (2.2, y1)])
    ax.text(2.2, -0.45, "source: English, read all at once", ha="center", fontsize=9)
    # Decoder (right).
    tgt_x = _lab06_tokens(ax, ("<bos>", *_TARGET[:-1]), 5.8, 9.9, 0.0, "white")
    box(ax, 7.85, 1.3, 4.4, 0.6, "embedding + positions", "0.95")
    box(ax, 7.85, 2.4, 4.4, 0.7, "MASKED self-attention (position t sees 0..t)", dec)
    box(
        ax,
        7.85,
        3.5,
        4.4,
        0.7,
        "cross-attention: Q from the decoder,\nK and V from the memory",
        dec,
    )
    box(ax, 7.85, 4.55, 4.4, 0.55, "feed-forward", dec)
    ax.text(10.12, 3.4, "x N", fontsize=9, va="center")
    box(ax, 7.85, 5.5, 4.4, 0.55, "linear: D -> V, softmax over the vocabulary", "#f6c89f")
    for x in tgt_x:
        arrow(ax, [(x, 0.17), (x, 0.98)])
    for y0, y1 in ((1.6, 2.05), (2.75, 3.15), (3.85, 4.27), (4.83, 5.22)):
        arrow(ax, [(7.85, y0), (7.85, y1)])
    arrow(ax, [(4.3, 4.8), (5.65, 3.6)], colour="#2b6cb0", connectionstyle="arc3,rad=-0.2")
    ax.text(4.55, 4.35, "keys, values", color="#2b6cb0", fontsize=8, rotation=-28)
    out_x = _lab06_tokens(ax, (*_TARGET, "<eos>")[: len(tgt_x)], 5.8, 9.9, 6.6, "#fff4e6")
    for x in out_x:
        arrow(ax, [(x, 5.78), (x, 6.43)])
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
        box(left, i + 0.5, 0.0, 0.85, 0.4, w_in, "white", fontsize=8)
        box(left, i + 0.5, 3.2, 0.85, 0.4, w_out, "#fff4e6", fontsize=8)
        arrow(left, [(i + 0.5, 0.22), (i + 0.5, 0.75)])
        arrow(left, [(i + 0.5, 2.45), (i + 0.5, 2.98)])
        left.text(i + 0.5, 3.65, "loss", ha="center", fontsize=7, color="0.35")
    box(left, n / 2, 1.65, n + 0.1, 1.7, "", "#fde2c8")
    # The causal mask: query t (row) may see keys 0..t (filled), not the later ones.
    mask = lambda t, s: "#c05621" if s <= t else "white"  # noqa: E731
    cells = {"pitch": 0.3, "size": 0.28, "edgecolor": "0.4", "linewidth": 0.5}
    grid(left, n / 2 - 0.6, 2.45, n, n, mask, **cells)
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
            box(right, 1.0 + 0.8 * i, y, 0.72, 0.36, w, "white", fontsize=7)
        x_out = 1.0 + 0.8 * (step + 1) + 0.5
        arrow(right, [(1.0 + 0.8 * step + 0.4, y), (x_out - 0.38, y)])
        box(right, x_out, y, 0.72, 0.36, words[step], "#fff4e6", fontsize=7)
        if step < n - 1:
            arrow(right, [(x_out, y - 0.2), (1.0 + 0.8 * (step + 1), y - 0.8)], colour="#2b6cb0")
    right.text(
        n * 0.65,
        -0.65,
        "each argmax is fed back: word t + 1 cannot start before word t exists",
        ha="center",
        fontsize=8,
        color="#2b6cb0",
    )
    return fig
