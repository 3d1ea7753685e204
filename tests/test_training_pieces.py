"""Lab 04's graded pieces of the training layer are public functions; the configs share one base.

The LightningModules call ``token_cross_entropy`` (the loss), ``log_metrics`` (the logging rule)
and ``schedule.build_optimizer`` (AdamW and its schedule); locking lab 04 replaces those three
bodies and leaves every class whole. Each function is checked here on its own against an
independent computation; the configs' shared validation and presets likewise.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from transformer_lab.graded import GRADED
from transformer_lab.models import (
    EncoderConfig,
    GPTConfig,
    ModelConfig,
    Seq2SeqConfig,
    Seq2SeqTransformer,
)
from transformer_lab.training import modules, schedule
from transformer_lab.training.modules import log_metrics, token_cross_entropy
from transformer_lab.training.schedule import OptimConfig, build_optimizer


def _reference_loss(logits: torch.Tensor, targets: torch.Tensor, ignore: int) -> torch.Tensor:
    """Mean of ``-log p(target)`` over the kept positions, written out without F.cross_entropy."""
    log_probs = torch.log_softmax(logits.double(), dim=-1).reshape(-1, logits.shape[-1])
    flat = targets.reshape(-1)
    kept = flat != ignore
    return -log_probs[kept.nonzero().flatten(), flat[kept]].mean()


@pytest.mark.parametrize("shape", [(3, 5, 7), (4, 7)])  # token head (B, T, C), sequence head
def test_token_cross_entropy_is_the_mean_over_kept_positions(shape: tuple[int, ...]) -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(*shape, generator=generator)
    targets = torch.randint(0, shape[-1], shape[:-1], generator=generator)
    targets.view(-1)[::3] = -100
    loss = token_cross_entropy(logits, targets)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss.double(), _reference_loss(logits, targets, -100))
    # Computed in float32 under half precision too.
    assert token_cross_entropy(logits.bfloat16(), targets).dtype == torch.float32


class _Recorder:
    """What ``log_metrics`` sees of a LightningModule: ``log``, ``log_dict``, a step, a trainer."""

    def __init__(self, step: int, every: int = 50, world_size: int = 1) -> None:
        self.global_step = step
        self._trainer = SimpleNamespace(log_every_n_steps=every, world_size=world_size)
        self.calls: list[tuple[str, Any, dict[str, Any]]] = []

    def log(self, name: str, value: Any, **options: Any) -> None:
        self.calls.append((name, value, options))

    def log_dict(self, values: Any, **options: Any) -> None:
        self.calls.append(("<dict>", values, options))


@pytest.mark.parametrize("bar", [True, False])
def test_log_metrics_logs_the_training_loss_on_written_steps_only(bar: bool) -> None:
    loss = torch.tensor(2.0)
    written, skipped = _Recorder(step=49), _Recorder(step=50)
    for module in (written, skipped):
        module._trainer.progress_bar_callback = object() if bar else None
    log_metrics(written, "train", loss, batch_size=8)  # type: ignore[arg-type]
    log_metrics(skipped, "train", loss, batch_size=8)  # type: ignore[arg-type]
    assert [c[0] for c in written.calls] == ["train_loss"]
    assert written.calls[0][2]["on_step"] and not written.calls[0][2]["on_epoch"]
    # Shown in the bar only where there is one: Lightning turns a bar's value into a number
    # (a host-device synchronisation on a GPU) at every step.
    assert written.calls[0][2]["prog_bar"] is bar
    assert skipped.calls == []


@pytest.mark.parametrize("world_size", [1, 2])
def test_log_metrics_logs_the_epoch_loss_and_the_metrics_of_validation(world_size: int) -> None:
    module = _Recorder(step=3, world_size=world_size)
    metrics = object()
    log_metrics(module, "val", torch.tensor(1.5), batch_size=8, metrics=metrics)  # type: ignore[arg-type]
    (name, _, options), (kind, logged, dict_options) = module.calls
    assert name == "val_loss" and options["on_epoch"] and options["batch_size"] == 8
    assert options["sync_dist"] == (world_size > 1)
    assert kind == "<dict>" and logged is metrics and dict_options["on_epoch"]


def test_build_optimizer_decays_matrices_only_and_warms_up_every_step() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    optim = OptimConfig(lr=1e-2, weight_decay=0.1, warmup_steps=4, total_steps=20)
    config = build_optimizer(model, optim)
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    assert config["lr_scheduler"]["interval"] == "step"
    decayed, undecayed = optimizer.param_groups
    assert decayed["weight_decay"] == 0.1 and all(p.dim() == 2 for p in decayed["params"])
    assert undecayed["weight_decay"] == 0.0 and all(p.dim() == 1 for p in undecayed["params"])
    assert len(decayed["params"]) + len(undecayed["params"]) == len(list(model.parameters()))
    rates = []
    for _ in range(20):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates[0] == pytest.approx(1e-2 / 5)  # (step + 1) / (warmup + 1)
    assert rates[4] == pytest.approx(1e-2)  # the peak, at the end of the warm-up
    assert rates[-1] < rates[4]


def test_build_optimizer_takes_the_runs_length_and_refuses_an_endless_one() -> None:
    model = nn.Linear(3, 3)
    config = build_optimizer(model, OptimConfig(warmup_steps=100), estimated_steps=10.0)
    assert config["optimizer"].param_groups[0]["lr"] == pytest.approx(1e-3 / 10)  # warm-up cut
    for estimate in (None, math.inf):
        with pytest.raises(ValueError, match=r"--trainer\.max_steps"):
            build_optimizer(model, OptimConfig(), estimated_steps=estimate)


def test_lab_04_grades_the_functions_not_the_lightning_hooks() -> None:
    graded = {name for name, lab in GRADED.items() if lab == "04_transformer_block"}
    assert {
        f"{modules.__name__}.token_cross_entropy",
        f"{modules.__name__}.log_metrics",
        f"{schedule.__name__}.build_optimizer",
    } <= graded
    assert not [name for name in GRADED if "Module." in name]  # no method of a LightningModule


def test_locking_lab_04_keeps_every_module_class_whole() -> None:
    from pathlib import Path

    from transformer_lab.grading.student import lock_source

    source = Path(modules.__file__).read_text()
    locked, names = lock_source(source, {"04_transformer_block"}, modules.__name__)
    assert set(names) == {"token_cross_entropy", "log_metrics"}
    namespace: dict[str, Any] = {}
    exec(compile(locked, modules.__file__, "exec"), namespace)  # the kit's own source, locked
    for cls in ("ClassifierModule", "Seq2SeqModule", "CausalLMModule"):
        assert "_shared_step" in vars(namespace[cls])
    with pytest.raises(NotImplementedError, match="04_transformer_block"):
        namespace["token_cross_entropy"](torch.zeros(1, 2), torch.zeros(1, dtype=torch.long))


@pytest.mark.parametrize(
    ("cls", "name", "sizes"),
    [
        (EncoderConfig, "tagging-small", {"vocab_size": 12}),
        (Seq2SeqConfig, "translation-small", {"src_vocab_size": 12, "tgt_vocab_size": 14}),
        (GPTConfig, "gpt-nano", {}),
    ],
)
def test_every_config_has_presets_and_the_same_validation(
    cls: type[ModelConfig], name: str, sizes: dict[str, int]
) -> None:
    config = cls.from_name(name, **sizes)
    assert isinstance(config, ModelConfig) and config.ff_dim == 4 * config.d_model
    with pytest.raises(ValueError, match=r"unknown .*preset 'nope'; known presets: \["):
        cls.from_name("nope")
    with pytest.raises(ValueError, match="d_model=30 is not divisible by n_heads=4"):
        cls.from_name(name, **sizes, d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="d_ff=0: must be >= 1"):
        cls.from_name(name, **sizes, d_ff=0)
    with pytest.raises(ValueError, match=r"dropout=1\.5"):
        cls.from_name(name, **sizes, dropout=1.5)


def test_the_seq2seq_encoder_reads_the_seq2seq_config_itself() -> None:
    config = Seq2SeqConfig(src_vocab_size=11, tgt_vocab_size=9, n_encoder_layers=3, d_ff=48)
    model = Seq2SeqTransformer(config)
    assert model.encoder.config is config
    assert model.encoder.embed.embedding.num_embeddings == 11
    assert len(model.encoder.blocks) == 3
    with pytest.raises(ValueError, match="bos_id=9 is outside tgt_vocab_size=9"):
        Seq2SeqConfig(src_vocab_size=11, tgt_vocab_size=9, bos_id=9)
