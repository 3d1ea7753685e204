"""Lab 07's figures: byte-pair merges, an embedding lookup, decoding rules and a beam search tree.

* :func:`bpe_merges_figure`: how BPE cuts a few words after each merge;
* :func:`one_hot_lookup`: an embedding lookup as ``one_hot(ids) @ E``;
* :func:`decoding_distributions`: next-token probabilities under several decoding rules;
* :func:`beam_tree`: the search tree of a hand-built next-token table, with chosen hypotheses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from matplotlib.figure import Figure
from torch import Tensor

from transformer_lab.figures.draw import HIGHLIGHT, SQUARE, box

__all__ = ["beam_tree", "bpe_merges_figure", "decoding_distributions", "one_hot_lookup"]


# Piece colours of the BPE figure (cycled), and the end-of-word symbol as drawn (the book's "_").
_PIECES = ("#c6dbef", "#fdd0a2", "#c7e9c0", "#dadaeb", "#fcbba1", "#fff2b3")
_EOW = "</w>"


def _shown(piece: str) -> str:
    return piece.replace(_EOW, "_")


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
    widths = [max(len(_shown("".join(step[w]))) for step in steps) for w in range(len(words))]
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
                shown = _shown(piece)
                colour = _PIECES[k % len(_PIECES)] if len(shown) > 1 else "white"
                box(
                    ax, x + len(shown) / 2, y, len(shown), 0.76, shown, colour,
                    style=SQUARE, edgecolor="0.3", fontsize=8, family="monospace",
                )  # fmt: skip
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
        box(
            axes[1],
            D / 2 - 0.5,
            i,
            D,
            1,
            "",
            "none",
            style=SQUARE,
            edgecolor=HIGHLIGHT,
            linewidth=1.5,
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
