"""Lab 08's figures: the GPT stack and its sizes, what a KV cache saves, dependencies, scale.

* :func:`gpt_diagram`: the decoder-only Transformer of GPT-2 and GPT-3, with a table of sizes;
* :func:`kv_cache_diagram`: the work of generating tokens without and with a KV cache;
* :func:`dependency_grid`: how much each output position depends on each input position;
* :func:`scale_chart`: parameters and training compute against the model width, log-log.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure
from torch import Tensor

from transformer_lab.figures.draw import arrow, box, grid

__all__ = ["dependency_grid", "gpt_diagram", "kv_cache_diagram", "scale_chart"]


_COLOURS = {
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
    c = _COLOURS
    label_box = functools.partial(box, fontsize=8.5)  # (ax, x, y, w, h, text, colour)
    flow = functools.partial(arrow, linewidth=1.0)  # (ax, points)
    ax.set_xlim(-0.3, 6.6)
    ax.set_ylim(-0.6, 10.2)
    ax.axis("off")
    for i, word in enumerate(("To", "be", ",", "or")):
        x = 1.2 + 1.2 * i
        ax.text(x, -0.35, word, ha="center", fontsize=9, family="monospace")
        flow(ax, [(x, -0.12), (x, 0.45)])
    label_box(
        ax,
        3.0,
        0.8,
        5.2,
        0.6,
        "token embedding (V x D) + position embedding (n_ctx x D)",
        c["embed"],
    )
    # One block, drawn once and repeated L times: the residual stream on the left, two branches.
    label_box(
        ax, 0.35 + 5.55 / 2, 1.4 + 5.75 / 2, 5.55, 5.75, "", "white",
        style="round,pad=0.02,rounding_size=0.1", edgecolor="0.5", linestyle="--",
    )  # fmt: skip
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
        flow(ax, [(3.6, y_norm - 0.25), (3.6, y_norm - 0.2)])
        label_box(ax, 3.6, y_norm, 3.0, 0.42, "layer norm", c["norm"])
        flow(ax, [(3.6, y_norm + 0.21), (3.6, y_layer - height / 2)])
        label_box(ax, 3.6, y_layer, 4.1, height, text, colour)
        ax.plot([3.6, 3.6], [y_layer + height / 2, y_plus], color="0.35", lw=1.0)
        flow(ax, [(3.6, y_plus), (stream + 0.22, y_plus)])
        label_box(ax, stream, y_plus, 0.42, 0.42, "+", "white", fontsize=11)
    ax.plot([stream, 3.0], [7.6, 7.6], color="0.35", lw=1.4)
    flow(ax, [(3.0, 7.6), (3.0, 7.72)])
    label_box(ax, 3.0, 7.95, 3.2, 0.45, "final layer norm", c["norm"])
    label_box(
        ax,
        3.0,
        8.85,
        4.8,
        0.65,
        "output layer D -> V (the token embedding, transposed: tied)",
        c["head"],
    )
    flow(ax, [(3.0, 8.18), (3.0, 8.52)])
    flow(ax, [(3.0, 9.18), (3.0, 9.55)])
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
    c = _COLOURS
    totals = []
    for ax, cached in zip(axes, (False, True), strict=True):

        def colour(step: int, pos: int, cached: bool = cached) -> str:
            known = prompt + step  # positions the model needs at this step
            if pos >= known:
                return "white"
            if not cached or step == 0 or pos == known - 1:
                return c["computed"]
            return c["cached"]

        # Rows are the steps of generation (the first at the top), columns the positions.
        grid(ax, 0.0, steps, steps, width, colour, size=0.9, edgecolor="0.4", linewidth=0.5)
        computed = sum(
            colour(step, pos) == c["computed"] for step in range(steps) for pos in range(width)
        )
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
    largest entry; exact zeros stay white, so a causal map shows an empty upper triangle. A
    colour bar gives the scale: the share of the row's largest dependence.

    Args:
        tables: title -> ``(T, T)`` table (rows: outputs, columns: inputs).
        labels: names of the positions (tokens), for the axes.

    Raises:
        ValueError: if a table is not square or nothing is given.
    """
    if not tables:
        raise ValueError("dependency_grid: nothing to draw")
    fig = Figure(figsize=(4.2 * len(tables) + 0.8, 4.2), layout="constrained")
    axes = fig.subplots(1, len(tables), squeeze=False)[0]
    image = None
    for ax, (title, table) in zip(axes, tables.items(), strict=True):
        t = table.detach().to("cpu", torch.float64)
        if t.ndim != 2 or t.shape[0] != t.shape[1]:
            raise ValueError(f"dependency_grid: {title!r} has shape {tuple(t.shape)}, not (T, T)")
        top = t.abs().amax(dim=1, keepdim=True).clamp_min(1e-300)
        shown = np.ma.masked_where(t.numpy() == 0.0, (t.abs() / top).numpy())
        image = ax.imshow(shown, cmap="viridis", vmin=0.0, vmax=1.0)
        ticks = list(range(t.shape[0]))
        names = list(labels) if labels is not None else [str(i) for i in ticks]
        ax.set_xticks(ticks, names, rotation=90, fontsize=8)
        ax.set_yticks(ticks, names, fontsize=8)
        ax.set_xlabel("input position s")
        ax.set_ylabel("output position t")
        zeros = int((t == 0).sum())
        ax.set_title(f"{title}\n({zeros} exact zeros, white)", fontsize=9)
    bar = fig.colorbar(image, ax=list(axes), shrink=0.8)  # one scale: every panel is 0..1
    bar.set_label("share of the row's largest |d out_t / d x_s|", fontsize=8)
    return fig


def scale_chart(points: Sequence[Mapping[str, Any]]) -> Figure:
    """Parameters and training compute against the model width, log-log, one line per family.

    The first and last model of each family are labelled; each label goes to the first of a few
    places around its point where it covers no plotted point, no other label and no legend, and
    stays inside the panel (GPT-2 and GPT-3 share widths, so their labels would sit on each
    other's points otherwise).

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
    labels: dict[Any, list[tuple[str, float, float]]] = {left: [], right: []}
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
                labels[left].append((p["label"], p["d_model"], p["params"]))
                if p.get("flops"):
                    labels[right].append((p["label"], p["d_model"], p["flops"]))
    for ax, what in (
        (left, "parameters (hollow: as published)"),
        (right, "training FLOPs (6 N D)"),
    ):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("model width d_model")
        ax.set_title(what, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
        ax.margins(x=0.08, y=0.12)  # room for the labels of the outermost points
    fig.draw_without_rendering()  # the layout settles: display coordinates are final
    for ax, texts in labels.items():
        _place_labels(ax, texts)
    return fig


#: Where a label may go around its point: (dx, dy) in points, and its alignment there.
_PLACES = [
    ((dx * k, dy * k), ha, va)
    for k in (1, 2, 3)
    for (dx, dy), ha, va in (
        ((5, -5), "left", "top"),
        ((-5, 5), "right", "bottom"),
        ((5, 5), "left", "bottom"),
        ((-5, -5), "right", "top"),
        ((7, 0), "left", "center"),
        ((-7, 0), "right", "center"),
    )
]


def _place_labels(ax: Any, texts: Sequence[tuple[str, float, float]]) -> None:
    """Annotate each ``(label, x, y)`` of ``ax`` at the first place of :data:`_PLACES` where its
    box covers no marker, no earlier label and no legend, inside the axes."""
    fig = ax.figure
    renderer = fig._get_renderer()
    radius = 6.0 * fig.dpi / 72.0  # about a marker's (and a hollow circle's) radius, in pixels
    centres = [
        ax.transData.transform(xy)
        for artist in (*ax.lines, *ax.collections)
        for xy in (artist.get_xydata() if hasattr(artist, "get_xydata") else artist.get_offsets())
    ]
    frame = ax.get_window_extent(renderer)
    legend = ax.get_legend()
    taken = [legend.get_window_extent(renderer)] if legend is not None else []
    for label, x, y in texts:
        for offset, ha, va in _PLACES:  # the last place is kept when none is clear
            note = ax.annotate(
                label, (x, y), xytext=offset, textcoords="offset points", ha=ha, va=va, fontsize=7
            )
            note.set_in_layout(False)  # placed after the layout: it must not move the axes
            box = note.get_window_extent(renderer)
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1
            inside = inside and frame.y0 <= box.y0 and box.y1 <= frame.y1
            clear = not any(box.overlaps(other) for other in taken) and not any(
                box.x0 - radius < cx < box.x1 + radius and box.y0 - radius < cy < box.y1 + radius
                for cx, cy in centres
            )
            if (inside and clear) or (offset, ha, va) == _PLACES[-1]:
                taken.append(box)
                break
            note.remove()
