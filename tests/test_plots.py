"""Plots return populated matplotlib figures and reject inconsistent input."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from matplotlib.figure import Figure

from transformer_lab.plots import (
    collect_attention,
    plot_attention_maps,
    plot_loss_curves,
    plot_positional_encoding,
    plot_similarity_vs_distance,
    read_metrics_csv,
)
from transformer_lab.positional import sinusoidal_encoding


def _write_metrics(path: Path) -> Path:
    """A metrics.csv laid out as Lightning's CSVLogger writes it (sparse columns)."""
    rows = [
        {"epoch": 0, "step": 9, "train_loss": 2.0, "val_loss": "", "val_acc": ""},
        {"epoch": 0, "step": 19, "train_loss": 1.5, "val_loss": "", "val_acc": ""},
        {"epoch": 0, "step": 19, "train_loss": "", "val_loss": 1.4, "val_acc": 0.5},
        {"epoch": 1, "step": 29, "train_loss": 0.7, "val_loss": "", "val_acc": ""},
        {"epoch": 1, "step": 39, "train_loss": "", "val_loss": 0.6, "val_acc": 0.9},
    ]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_read_metrics_csv_skips_empty_cells(tmp_path: Path) -> None:
    series = read_metrics_csv(_write_metrics(tmp_path / "metrics.csv"))
    assert series["train_loss"] == [(9, 2.0), (19, 1.5), (29, 0.7)]
    assert series["val_acc"] == [(19, 0.5), (39, 0.9)]
    assert "step" not in series and "epoch" not in series


def test_loss_curves_draw_one_line_per_loss(tmp_path: Path) -> None:
    fig = plot_loss_curves(_write_metrics(tmp_path / "metrics.csv"))
    assert isinstance(fig, Figure)
    lines = fig.axes[0].get_lines()
    assert sorted(line.get_label() for line in lines) == ["train_loss", "val_loss"]
    val = next(line for line in lines if line.get_label() == "val_loss")
    assert list(val.get_xdata()) == [19, 39] and list(val.get_ydata()) == [1.4, 0.6]


def test_loss_curves_reject_unknown_metric(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="bogus"):
        plot_loss_curves(_write_metrics(tmp_path / "metrics.csv"), metrics=["bogus"])


def test_attention_grid_is_layers_by_heads() -> None:
    weights = [torch.softmax(torch.randn(2, 3, 5, 5), dim=-1) for _ in range(2)]  # (B, H, T, S)
    fig = plot_attention_maps(weights, query_tokens=list("abcde"))
    images = [ax for ax in fig.axes if ax.get_images()]
    assert len(images) == 2 * 3
    # The second example of the batch is drawn when asked for.
    fig1 = plot_attention_maps(weights, batch_index=1)
    first = next(ax for ax in fig1.axes if ax.get_images()).get_images()[0].get_array()
    torch.testing.assert_close(torch.as_tensor(first.data), weights[0][1, 0].float())


def test_attention_rejects_wrong_labels() -> None:
    with pytest.raises(ValueError, match="query labels"):
        plot_attention_maps(torch.rand(1, 2, 4, 4), query_tokens=["a", "b"])
    with pytest.raises(ValueError, match="1 titles for 2 heatmaps"):
        plot_attention_maps(torch.rand(2, 4, 4), titles=["one"])


def test_heads_picked_from_several_layers_keep_their_titles() -> None:
    fig = plot_attention_maps(torch.rand(3, 4, 4), titles=["layer 5, head 1", "a", "b"])
    titles = [ax.get_title() for ax in fig.axes if ax.get_images()]
    assert titles == ["layer 5, head 1", "a", "b"]


def test_positional_heatmap_shows_the_table() -> None:
    pe = sinusoidal_encoding(16, 8)
    fig = plot_positional_encoding(pe)
    shown = fig.axes[0].get_images()[0].get_array()
    torch.testing.assert_close(torch.as_tensor(shown.data), pe)
    with pytest.raises(ValueError, match="expected"):
        plot_positional_encoding(pe[0])


def test_similarity_depends_only_on_distance_for_sinusoids() -> None:
    pe = sinusoidal_encoding(32, 16)
    fig = plot_similarity_vs_distance(pe, reference_positions=[0, 8])
    a, b = fig.axes[0].get_lines()[:2]
    # Curves of p=0 and p=8 coincide where both are defined: similarity is a function of q - p.
    ya = dict(zip(a.get_xdata(), a.get_ydata(), strict=True))
    yb = dict(zip(b.get_xdata(), b.get_ydata(), strict=True))
    common = sorted(set(ya) & set(yb))
    assert len(common) > 10
    assert max(abs(ya[k] - yb[k]) for k in common) < 1e-6
    with pytest.raises(ValueError, match="outside"):
        plot_similarity_vs_distance(pe, reference_positions=[40])


def test_collect_attention_from_an_encoder_respects_padding() -> None:
    from transformer_lab.models import EncoderClassifier, EncoderConfig

    cfg = EncoderConfig(vocab_size=9, max_len=6, d_model=16, n_layers=2, n_heads=2)
    model = EncoderClassifier(cfg).eval()
    tokens = torch.randint(3, 9, (2, 6))
    padding = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    before = model(tokens, padding)
    maps = collect_attention(model, tokens, padding_mask=padding)
    assert [tuple(m.shape) for m in maps] == [(2, 2, 6, 6)] * 2
    torch.testing.assert_close(maps[0].sum(-1), torch.ones(2, 2, 6))
    assert float(maps[1][1, :, :, 4:].abs().max()) == 0.0  # padded keys get no attention
    # The hooks are gone afterwards and the model computes what it computed before.
    torch.testing.assert_close(model(tokens, padding), before)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    fig = plot_attention_maps(maps, query_tokens=[str(int(t)) for t in tokens[0]])
    assert len([ax for ax in fig.axes if ax.get_images()]) == 4


def test_collect_attention_from_a_gpt_is_causal() -> None:
    from transformer_lab.models import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=7, n_ctx=8, d_model=8, n_layers=2, n_heads=2)).eval()
    maps = collect_attention(model, torch.randint(0, 7, (1, 5)))
    assert len(maps) == 2 and maps[0].shape == (1, 2, 5, 5)
    for w in maps:
        assert (w.triu(1) == 0).all()  # no weight on future tokens
        torch.testing.assert_close(w.sum(-1), torch.ones(1, 2, 5))


def _lab08_scale_points() -> list[dict]:
    """The points lab 08's scale chart draws (the kit's counts; a small char LM)."""
    from transformer_lab.scale import GPT2_FAMILY, GPT3_FAMILY, gpt_param_count, training_flops

    points = []
    for family, specs in (("GPT-2", GPT2_FAMILY), ("GPT-3 (300B tokens)", GPT3_FAMILY)):
        for spec in specs:
            n = gpt_param_count(spec.n_layers, spec.d_model, spec.vocab_size, spec.n_ctx)
            flops = training_flops(n, spec.n_tokens) if spec.n_tokens else None
            points.append(
                dict(family=family, label=spec.name, d_model=spec.d_model,
                     published=spec.n_params, params=n, flops=flops)
            )  # fmt: skip
    lm = dict(family="this lab", label="your char LM", d_model=128, params=8e5, flops=8e10)
    return [*points, lm]


def test_scale_chart_labels_cover_no_point_and_no_other_label() -> None:
    """GPT-2 and GPT-3 share widths: each label's box (display coordinates) must stay clear of
    every marker, of the other labels and of the legend, inside its panel."""
    from transformer_lab.figures.lab08 import scale_chart

    fig = scale_chart(_lab08_scale_points())
    fig.draw_without_rendering()
    renderer = fig._get_renderer()
    for ax in fig.axes:
        labels = [t for t in ax.texts if t.get_text()]
        assert len(labels) >= 3, [t.get_text() for t in labels]
        boxes = [t.get_window_extent(renderer) for t in labels]
        centres = [
            ax.transData.transform(xy)
            for artist in (*ax.lines, *ax.collections)
            for xy in (
                artist.get_xydata() if hasattr(artist, "get_xydata") else artist.get_offsets()
            )
        ]
        frame, legend = ax.get_window_extent(renderer), ax.get_legend().get_window_extent(renderer)
        for i, (text, box) in enumerate(zip(labels, boxes, strict=True)):
            name = text.get_text()
            assert frame.x0 <= box.x0 and box.x1 <= frame.x1, name
            assert frame.y0 <= box.y0 and box.y1 <= frame.y1, name
            assert not box.overlaps(legend), name
            for other, box2 in zip(labels[i + 1 :], boxes[i + 1 :], strict=True):
                assert not box.overlaps(box2), (name, other.get_text())
            for cx, cy in centres:
                assert not (box.x0 <= cx <= box.x1 and box.y0 <= cy <= box.y1), (name, cx, cy)
    names = {t.get_text() for t in fig.axes[0].texts}
    assert {"GPT-2 XL", "GPT-2 small", "GPT-3 Small", "GPT-3 175B", "your char LM"} <= names


def test_dependency_grid_has_a_colour_bar_from_zero_to_one() -> None:
    from transformer_lab.figures.lab08 import dependency_grid

    causal = torch.tril(torch.rand(6, 6, generator=torch.Generator().manual_seed(0))) + 0.1
    fig = dependency_grid({"a": causal.tril(), "b": causal})
    panels = [ax for ax in fig.axes if ax.images]
    bars = [ax for ax in fig.axes if not ax.images]
    assert len(panels) == 2 and len(bars) == 1  # one shared scale
    assert bars[0].get_ylim() == pytest.approx((0.0, 1.0))
    assert "largest" in bars[0].get_ylabel()
