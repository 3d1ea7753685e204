"""Matplotlib figures for the labs and the CLI: loss curves, attention maps, positional encodings.

Every function builds and returns a ``matplotlib.figure.Figure`` without touching pyplot's global
state (no ``plt.show()``, no current-figure side effects), so the functions are safe in tests and
scripts; in Jupyter, a returned figure displays itself as the cell's value.

Conventions (see ``docs/architecture.md``): attention weights have shape ``(B, H, T, S)`` per layer,
rows are queries and columns keys; positional tables are ``(T, D)``, positions in rows.

References: the attention-map grid follows the visualisations in Vaswani et al., "Attention Is
All You Need" (2017), appendix; the positional-encoding heatmap follows the figures of Prince,
*Understanding Deep Learning*, chapter 12 (positional encoding).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from matplotlib.figure import Figure
from torch import Tensor, nn

__all__ = [
    "collect_attention",
    "plot_attention_maps",
    "plot_loss_curves",
    "plot_positional_encoding",
    "plot_similarity_vs_distance",
    "read_metrics_csv",
]


def read_metrics_csv(path: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Read a Lightning ``CSVLogger`` ``metrics.csv`` into per-metric ``(step, value)`` series.

    The logger writes one row per logging call with empty cells for metrics not logged in that
    call; empty cells are skipped.

    Args:
        path: the ``metrics.csv`` file.

    Returns:
        ``{metric_name: [(step, value), ...]}`` for every column except ``step`` and ``epoch``.

    Raises:
        ValueError: if the file has no ``step`` column.
    """
    path = Path(path)
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        fields = reader.fieldnames or []
        if "step" not in fields:
            raise ValueError(f"{path} has no 'step' column (columns: {fields})")
        series: dict[str, list[tuple[int, float]]] = {
            name: [] for name in fields if name not in ("step", "epoch")
        }
        for row in reader:
            step = int(float(row["step"]))
            for name in series:
                if row.get(name):
                    series[name].append((step, float(row[name])))
    return series


def plot_loss_curves(
    metrics_csv: str | Path,
    metrics: Sequence[str] | None = None,
    *,
    log_y: bool = False,
) -> Figure:
    """Plot training and validation curves from a ``CSVLogger`` ``metrics.csv``.

    Args:
        metrics_csv: path to ``metrics.csv`` (``runs/<name>/version_<n>/metrics.csv``).
        metrics: columns to draw; default every column whose name ends in ``loss``.
        log_y: use a logarithmic y axis.

    Returns:
        A figure with one line per metric against the global step.

    Raises:
        ValueError: if a requested metric is not in the file, or nothing is left to plot.
    """
    series = read_metrics_csv(metrics_csv)
    if metrics is None:
        names = [name for name in series if name.endswith("loss") and series[name]]
    else:
        missing = [name for name in metrics if name not in series]
        if missing:
            raise ValueError(f"metrics {missing} are not in {metrics_csv}: {sorted(series)}")
        names = list(metrics)
    if not names:
        raise ValueError(f"{metrics_csv} holds no loss values to plot (columns: {sorted(series)})")
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.add_subplot()
    for name in names:
        steps, values = zip(*series[name], strict=True) if series[name] else ((), ())
        # Validation is logged once per epoch: mark its points so sparse curves stay visible.
        ax.plot(steps, values, label=name, marker="o" if len(steps) < 30 else None)
    ax.set_xlabel("step")
    ax.set_ylabel("value")
    if log_y:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def _as_layer_stack(weights: Tensor | Sequence[Tensor], batch_index: int) -> Tensor:
    """Bring attention weights to shape ``(L, H, T, S)`` for one example."""
    layers = [weights] if isinstance(weights, Tensor) and weights.dim() != 5 else list(weights)
    stack = []
    for layer, w in enumerate(layers):
        w = w.detach().float().cpu()
        if w.dim() == 4:  # (B, H, T, S)
            w = w[batch_index]  # (H, T, S)
        elif w.dim() == 2:  # (T, S): a single head
            w = w[None]  # (1, T, S)
        if w.dim() != 3:
            raise ValueError(
                f"attention weights of layer {layer} have shape {tuple(w.shape)}; "
                "expected (B, H, T, S), (H, T, S) or (T, S)"
            )
        stack.append(w)
    shapes = {tuple(w.shape) for w in stack}
    if len(shapes) != 1:
        raise ValueError(f"layers have different attention shapes: {sorted(shapes)}")
    return torch.stack(stack)  # (L, H, T, S)


@torch.no_grad()
def collect_attention(
    model: nn.Module, *args: Any, module_types: tuple[type, ...] | None = None, **kwargs: Any
) -> list[Tensor]:
    """Run ``model(*args, **kwargs)`` and return the attention weights of every attention layer.

    The kit's blocks call their attention with ``need_weights=False`` (the fused kernel); a
    forward pre-hook switches each call to the explicit path, and a forward hook keeps the
    weights, so the model itself needs no changes. Layers appear in the order they ran (encoder
    blocks first; a decoder block's self-attention before its cross-attention).

    Args:
        model: e.g. an ``EncoderClassifier``, ``Seq2SeqTransformer`` or ``GPT`` (in eval mode).
        *args: the model's inputs, e.g. ``tokens``.
        module_types: attention classes to record (default the kit's ``MultiHeadAttention``);
            their ``forward`` must accept ``need_weights`` and return ``(out, weights)``.
        **kwargs: more inputs, e.g. ``padding_mask=...``.

    Returns:
        One ``(B, H, T, S)`` tensor per attention call, ready for :func:`plot_attention_maps`.

    Raises:
        ValueError: if the model ran no attention layer of the given types.
    """
    if module_types is None:
        from transformer_lab.attention import MultiHeadAttention

        # torch's own attention too: the PyTorch stand-in of a locked EncoderBlock uses it.
        module_types = (MultiHeadAttention, nn.MultiheadAttention)
    maps: list[Tensor] = []

    def ask_for_weights(module: nn.Module, a: tuple, kw: dict) -> tuple[tuple, dict]:
        if isinstance(module, nn.MultiheadAttention):
            return a, {**kw, "need_weights": True, "average_attn_weights": False}
        return a, {**kw, "need_weights": True}

    def keep_weights(module: nn.Module, a: tuple, kw: dict, output: Any) -> None:
        if isinstance(output, tuple) and len(output) == 2 and output[1] is not None:
            maps.append(output[1].detach())

    handles = []
    for module in model.modules():
        if isinstance(module, module_types):
            handles.append(module.register_forward_pre_hook(ask_for_weights, with_kwargs=True))
            handles.append(module.register_forward_hook(keep_weights, with_kwargs=True))
    fast = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)  # torch's fused layers skip the hooks
    try:
        model(*args, **kwargs)
    finally:
        torch.backends.mha.set_fastpath_enabled(fast)
        for handle in handles:
            handle.remove()
    if not maps:
        raise ValueError(
            f"{type(model).__name__} ran no attention layer of types "
            f"{[t.__name__ for t in module_types]}: nothing to collect"
        )
    return maps


def plot_attention_maps(
    weights: Tensor | Sequence[Tensor],
    *,
    query_tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | None = None,
    batch_index: int = 0,
    cell_size: float = 2.2,
    titles: Sequence[str] | None = None,
) -> Figure:
    """Draw attention weights as a grid of heatmaps, one row per layer and one column per head.

    Args:
        weights: one tensor per layer of shape ``(B, H, T, S)`` (or ``(H, T, S)``, ``(T, S)``),
            or a single tensor ``(L, B, H, T, S)``; rows are queries, columns keys.
        query_tokens: labels for the ``T`` query positions (rows).
        key_tokens: labels for the ``S`` key positions (columns); default ``query_tokens`` when
            ``S == T``.
        batch_index: which example of the batch to show.
        cell_size: inches per heatmap.
        titles: one per heatmap, row by row (default ``"layer l, head h"``), e.g. for heads
            picked from several layers and passed as one ``(H, T, S)`` tensor.

    Returns:
        A figure with an ``L x H`` grid of axes (weights in ``[0, 1]`` on a shared colour scale).

    Raises:
        ValueError: if shapes are inconsistent or the labels do not match ``T``/``S``.
    """
    stack = _as_layer_stack(weights, batch_index)  # (L, H, T, S)
    n_layers, n_heads, t, s = stack.shape
    if key_tokens is None and query_tokens is not None and s == t:
        key_tokens = query_tokens
    if query_tokens is not None and len(query_tokens) != t:
        raise ValueError(f"{len(query_tokens)} query labels for T={t} query positions")
    if key_tokens is not None and len(key_tokens) != s:
        raise ValueError(f"{len(key_tokens)} key labels for S={s} key positions")
    if titles is not None and len(titles) != n_layers * n_heads:
        raise ValueError(f"{len(titles)} titles for {n_layers * n_heads} heatmaps")
    # Room for readable token labels: about a quarter inch per token, labels on the outer axes.
    cell = max(cell_size, 0.25 * max(t, s) + 0.8)
    fig = Figure(figsize=(cell * n_heads + 1.0, cell * n_layers), layout="constrained")
    axes = fig.subplots(n_layers, n_heads, squeeze=False, sharex=True, sharey=True)
    image = None
    for layer in range(n_layers):
        for head in range(n_heads):
            ax = axes[layer][head]
            image = ax.imshow(stack[layer, head].numpy(), vmin=0.0, vmax=1.0, cmap="viridis")
            title = (
                f"layer {layer}, head {head}" if titles is None else titles[layer * n_heads + head]
            )
            ax.set_title(title, fontsize=9)
            for setter, labels in ((ax.set_yticks, query_tokens), (ax.set_xticks, key_tokens)):
                if labels is None:
                    setter([])
                else:
                    setter(range(len(labels)), labels=list(labels), fontsize=8)
            if key_tokens is not None:
                ax.tick_params(axis="x", labelrotation=90)
            ax.tick_params(labelleft=head == 0, labelbottom=layer == n_layers - 1)
    axes[-1][0].set_xlabel("key")
    axes[-1][0].set_ylabel("query")
    fig.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
    return fig


def plot_positional_encoding(pe: Tensor, *, title: str = "positional encoding") -> Figure:
    """Heatmap of a positional table, positions down and dimensions across.

    Args:
        pe: table of shape ``(T, D)``, e.g. ``sinusoidal_encoding(64, 128)``.
        title: axes title.

    Returns:
        The figure.

    Raises:
        ValueError: if ``pe`` is not two-dimensional.
    """
    if pe.dim() != 2:
        raise ValueError(f"pe has shape {tuple(pe.shape)}; expected (T, D)")
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.add_subplot()
    table = pe.detach().float().cpu().numpy()
    image = ax.imshow(table, aspect="auto", cmap="RdBu", vmin=-1, vmax=1)
    ax.set_xlabel("dimension")
    ax.set_ylabel("position")
    ax.set_title(title)
    fig.colorbar(image, ax=ax)
    return fig


def plot_similarity_vs_distance(
    pe: Tensor, *, reference_positions: Sequence[int] | None = None, normalize: bool = True
) -> Figure:
    """Similarity of ``PE[p]`` to every other position, against the signed distance ``q - p``.

    For the sinusoidal table the dot product ``PE[p] . PE[q]`` depends only on ``q - p``, so the
    curves of different reference positions lie on top of each other; a learned table need not
    show this.

    Args:
        pe: table of shape ``(T, D)``.
        reference_positions: positions ``p`` to draw (default: start, quarter and middle).
        normalize: cosine similarity instead of the raw dot product.

    Returns:
        The figure, one curve per reference position.

    Raises:
        ValueError: if ``pe`` is not ``(T, D)`` or a reference position is out of range.
    """
    if pe.dim() != 2:
        raise ValueError(f"pe has shape {tuple(pe.shape)}; expected (T, D)")
    table = pe.detach().double().cpu()  # (T, D)
    t = table.shape[0]
    if reference_positions is None:
        reference_positions = sorted({0, t // 4, t // 2})
    bad = [p for p in reference_positions if not 0 <= p < t]
    if bad:
        raise ValueError(f"reference positions {bad} lie outside 0..{t - 1}")
    if not torch.isfinite(table).all():
        raise ValueError("pe contains non-finite values")
    if normalize:
        table = table / table.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    similarity = table @ table.T  # (T, T)
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.add_subplot()
    offsets = torch.arange(t)
    for p in reference_positions:
        ax.plot((offsets - p).numpy(), similarity[p].numpy(), label=f"p = {p}")
    ax.set_xlabel("distance q - p")
    ax.set_ylabel("cosine similarity" if normalize else "dot product")
    ax.axvline(0, color="grey", lw=0.5)
    ax.grid(alpha=0.3)
    ax.legend()
    return fig
