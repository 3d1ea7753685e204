"""Lab 04's diagram: the encoder block, post-norm ("Add & Norm", the lecture) beside pre-norm."""

from __future__ import annotations

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Circle

from transformer_lab.figures.draw import arrow, box

__all__ = ["encoder_block_diagram"]


_COLOURS = {"attn": "#f6c28b", "ff": "#9cc3e6", "norm": "#b5dfa8"}


def _sublayer(ax: Axes, x: float, y: float, text: str, kind: str, width: float = 0.46) -> None:
    """A sub-layer (``kind``: attn, ff, norm) centred at ``(x, y)`` (axes coordinates)."""
    box(
        ax, x, y, width, 0.07, text, _COLOURS[kind],
        style="round,pad=0.008", edgecolor="black", linewidth=0.8, fontsize=8.5,
    )  # fmt: skip


def _flow(ax: Axes, points: list[tuple[float, float]], colour: str = "black") -> None:
    """The block's data flow along ``points``: thin lines, a filled head at the end."""
    arrow(ax, points, colour=colour, linewidth=1.0, head="-|>", shrinkA=0)


def _residual_sum(ax: Axes, x: float, y: float) -> None:
    """The residual sum: a circled plus at ``(x, y)``."""
    ax.add_patch(Circle((x, y), 0.022, facecolor="white", edgecolor="black", linewidth=0.8))
    ax.text(x, y - 0.002, "+", ha="center", va="center", fontsize=10)


def _post_norm(ax: Axes) -> None:
    """Post-norm: each sub-layer's output is added to its input, then the sum is normalised."""
    c, side, res = 0.55, 0.2, "#c0392b"
    _flow(ax, [(c, 0.05), (c, 0.145)])
    _sublayer(ax, c, 0.18, "multi-head self-attention", "attn")
    _flow(ax, [(c, 0.215), (c, 0.298)])
    _residual_sum(ax, c, 0.32)
    _flow(ax, [(c, 0.342), (c, 0.385)])
    _sublayer(ax, c, 0.42, "LayerNorm 1", "norm")
    _flow(ax, [(c, 0.455), (c, 0.545)])
    _sublayer(ax, c, 0.58, "feed-forward", "ff")
    _flow(ax, [(c, 0.615), (c, 0.698)])
    _residual_sum(ax, c, 0.72)
    _flow(ax, [(c, 0.742), (c, 0.785)])
    _sublayer(ax, c, 0.82, "LayerNorm 2", "norm")
    _flow(ax, [(c, 0.855), (c, 0.95)])
    # The residual paths carry the sub-layer's input around it (the "Add" of "Add & Norm").
    _flow(ax, [(c, 0.08), (side, 0.08), (side, 0.32), (c - 0.022, 0.32)], res)
    _flow(ax, [(c, 0.49), (side, 0.49), (side, 0.72), (c - 0.022, 0.72)], res)
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


def _pre_norm(ax: Axes) -> None:
    """Pre-norm: each sub-layer sees a normalised copy; the residual stream is never normalised."""
    c, branch, res = 0.32, 0.68, "#c0392b"
    _flow(ax, [(c, 0.05), (c, 0.378)], res)
    _residual_sum(ax, c, 0.4)
    _flow(ax, [(c, 0.422), (c, 0.778)], res)
    _residual_sum(ax, c, 0.8)
    _flow(ax, [(c, 0.822), (c, 0.95)], res)
    _flow(ax, [(c, 0.08), (branch, 0.08), (branch, 0.125)])
    _sublayer(ax, branch, 0.16, "LayerNorm 1", "norm", width=0.5)
    _flow(ax, [(branch, 0.195), (branch, 0.245)])
    _sublayer(ax, branch, 0.28, "multi-head self-attention", "attn", width=0.5)
    _flow(ax, [(branch, 0.315), (branch, 0.4), (c + 0.022, 0.4)])
    _flow(ax, [(c, 0.48), (branch, 0.48), (branch, 0.525)])
    _sublayer(ax, branch, 0.56, "LayerNorm 2", "norm", width=0.5)
    _flow(ax, [(branch, 0.595), (branch, 0.645)])
    _sublayer(ax, branch, 0.68, "feed-forward", "ff", width=0.5)
    _flow(ax, [(branch, 0.715), (branch, 0.8), (c + 0.022, 0.8)])
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
        (left, _post_norm, "post-norm, norm_first=False\n(Add & Norm, as in the lecture)"),
        (right, _pre_norm, "pre-norm, norm_first=True\n(GPT-2 and most large models)"),
    ):
        ax.set_xlim(0, 1)
        ax.set_ylim(-0.2, 1.1)
        ax.set_axis_off()
        ax.set_title(title, fontsize=10)
        draw(ax)
    return fig
