"""The Lightning training layer: schedule, precision choice, modules, checkpoints and resuming."""

from __future__ import annotations

import copy
import io
import itertools
import math
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn

from transformer_lab.training.devices import choose_precision, print_info
from transformer_lab.training.schedule import (
    build_adamw,
    warmup_cosine_lambda,
    warmup_cosine_scheduler,
    weight_decay_groups,
)

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
QUIET = [
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--examples.num_examples=0",
]


# -- schedule ---------------------------------------------------------------------------------


def test_warmup_is_linear_then_cosine_reaches_the_floor() -> None:
    f = warmup_cosine_lambda(warmup_steps=4, total_steps=14, min_lr_ratio=0.1)
    assert [f(s) for s in range(4)] == pytest.approx([0.2, 0.4, 0.6, 0.8])
    assert f(4) == pytest.approx(1.0)
    assert f(9) == pytest.approx(0.1 + 0.9 * 0.5)  # half-way through the cosine
    assert f(14) == pytest.approx(0.1) and f(1000) == pytest.approx(0.1)
    decay = [f(s) for s in range(4, 15)]
    assert all(a > b for a, b in itertools.pairwise(decay))


def test_scheduler_scales_the_optimizer_rate() -> None:
    p = nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=0.5)
    sched = warmup_cosine_scheduler(opt, warmup_steps=1, total_steps=3)
    rates = []
    for _ in range(4):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert rates == pytest.approx([0.25, 0.5, 0.25, 0.0])


@pytest.mark.parametrize(
    ("warmup", "total", "floor", "message"),
    [(-1, 10, 0.0, "warmup_steps=-1"), (10, 10, 0.0, "total_steps=10"), (0, 5, 1.5, "1.5")],
)
def test_schedule_rejects_bad_values(warmup: int, total: int, floor: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        warmup_cosine_lambda(warmup, total, floor)


def test_weight_decay_only_on_matrices_and_tied_weights_once() -> None:
    model = nn.Sequential(nn.Embedding(5, 4), nn.LayerNorm(4), nn.Linear(4, 5))
    model[2].weight = model[0].weight  # tied output layer
    decayed, plain = weight_decay_groups(model, 0.1)
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert [p.shape for p in decayed["params"]] == [torch.Size([5, 4])]
    assert sorted(p.numel() for p in plain["params"]) == [4, 4, 5]  # LN weight, LN bias, bias
    with pytest.raises(ValueError, match="weight_decay=-1"):
        weight_decay_groups(model, -1)


def test_adamw_is_fused_wherever_torch_has_the_kernel() -> None:
    groups = weight_decay_groups(nn.Linear(3, 2), 0.1)
    assert build_adamw(groups, 1e-3, (0.9, 0.99)).defaults["fused"]  # CPU, torch >= 2.4
    assert build_adamw(groups, 1e-3, (0.9, 0.99), fused=True).defaults["fused"]
    assert not build_adamw(groups, 1e-3, (0.9, 0.99), fused=False).defaults["fused"]


def test_adamw_without_a_fused_kernel_falls_back_or_names_the_device(monkeypatch) -> None:
    real = torch.optim.AdamW

    def old_torch(params, *args, fused=None, **kwargs):  # torch < 2.4 had no fused CPU AdamW
        if fused:
            raise RuntimeError("`fused=True` requires all the params to be on CUDA")
        return real(params, *args, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", old_torch)
    groups = weight_decay_groups(nn.Linear(3, 2), 0.1)
    assert not build_adamw(groups, 1e-3, (0.9, 0.99)).defaults.get("fused")
    with pytest.raises(ValueError, match="no fused AdamW for parameters on cpu"):
        build_adamw(groups, 1e-3, (0.9, 0.99), fused=True)


# -- devices ----------------------------------------------------------------------------------


def test_precision_follows_the_hardware(monkeypatch: pytest.MonkeyPatch) -> None:
    assert choose_precision("cpu") == "32-true"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert choose_precision("cuda") == "bf16-mixed"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)  # a T4
    assert choose_precision("cuda") == "16-mixed"
    with pytest.raises(ValueError, match="'tpu'"):
        choose_precision("tpu")


def test_print_info_names_device_precision_and_versions() -> None:
    out = io.StringIO()
    print_info(out)
    text = out.getvalue()
    for word in ("device", "precision", "python", "torch", "lightning", "torchmetrics"):
        assert word in text
    assert torch.__version__ in text and "transformer_lab" in text


# -- modules ----------------------------------------------------------------------------------


def _tagging_batch(n: int = 8, t: int = 6, vocab: int = 7) -> dict[str, torch.Tensor]:
    tokens = torch.randint(3, vocab, (n, t))
    return {
        "tokens": tokens,
        "padding_mask": torch.ones(n, t, dtype=torch.bool),
        "targets": tokens.flip(1),
    }


def test_classifier_accepts_a_model_built_from_student_blocks() -> None:
    from transformer_lab.blocks import EncoderBlock
    from transformer_lab.models import EncoderClassifier, EncoderConfig
    from transformer_lab.training.modules import ClassifierModule

    cfg = EncoderConfig(vocab_size=7, max_len=6, d_model=16, n_layers=1, n_heads=2)
    blocks = [EncoderBlock(16, 2, 32)]
    module = ClassifierModule(model=EncoderClassifier(cfg, blocks=blocks))
    assert "model" not in module.hparams
    assert module.hparams["config"]["d_model"] == 16  # taken from the model's config
    assert module.model.encoder is not None
    loss = module._shared_step(_tagging_batch(), "val")
    assert loss.ndim == 0 and math.isfinite(float(loss))


def test_module_needs_a_config_or_a_model() -> None:
    from transformer_lab.training.modules import ClassifierModule, OptimConfig

    with pytest.raises(ValueError, match="needs a config or a model"):
        ClassifierModule()
    with pytest.raises(ValueError, match="lr=0"):
        OptimConfig(lr=0)


def test_classifier_overfits_one_batch() -> None:
    """A semantic check of the training step: the loss goes down and accuracy reaches 1."""
    from transformer_lab.models import EncoderConfig
    from transformer_lab.training.modules import ClassifierModule, OptimConfig

    cfg = EncoderConfig(vocab_size=7, max_len=6, d_model=32, n_layers=1, n_heads=2)
    module = ClassifierModule(cfg, optim=OptimConfig(lr=3e-3, warmup_steps=0, total_steps=300))
    batch = _tagging_batch()
    opt = torch.optim.AdamW(module.parameters(), lr=3e-3)
    first = None
    for _ in range(150):
        logits = module(batch["tokens"], padding_mask=batch["padding_mask"])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), batch["targets"].flatten())
        first = float(loss) if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    predictions = module.predict_batch(batch)
    assert float(loss) < 0.1 * first
    assert torch.equal(predictions, batch["targets"])


# -- every config under fast_dev_run ----------------------------------------------------------


def _config_args(config: Path, tmp_path: Path, request: pytest.FixtureRequest) -> list[str]:
    args = ["fit", "--config", str(config), "--run.save_dir", str(tmp_path / "runs"), *QUIET]
    text = config.read_text()
    if "CharCorpusDataModule" in text:
        corpus = request.getfixturevalue("tiny_shakespeare_path")  # skips where it is absent
        # The GPU recipe's shapes cost a minute per step on a CPU: the wiring is what is tested.
        args += ["--data.init_args.path", str(corpus), "--data.init_args.block_size=32"]
    return args


CONFIG_FILES = sorted(CONFIGS.glob("*.yaml"))


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
@pytest.mark.parametrize("config", CONFIG_FILES, ids=lambda p: p.stem)
def test_every_config_runs_under_fast_dev_run(
    config: Path, precision: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """One step and one validation batch per recipe, in fp32 and in bf16 mixed precision.

    bf16-mixed is what every recent GPU gets; with the recipes' gradient clipping and the fused
    AdamW it used to crash in Lightning's clipping (the CPU runs the same code path).
    """
    from transformer_lab.training.cli import make_cli

    args = [*_config_args(config, tmp_path, request), "--trainer.fast_dev_run=true"]
    # torch.compile (GPU recipes) costs a minute of compiling on a CPU: its switch is tested apart.
    args += ["--data.init_args.batch_size=4", "--model.init_args.compile_model=false"]
    args += [f"--trainer.precision={precision}"]
    cli = make_cli(args)
    assert cli.trainer.global_step == 1
    assert cli.trainer.precision == precision
    assert cli.trainer.gradient_clip_val, "every recipe clips its gradients"
    assert cli.trainer.optimizers[0].defaults["fused"]
    assert math.isfinite(float(cli.trainer.callback_metrics["val_loss"]))
    # The DataModule's sizes were linked into the model config, not repeated in the YAML.
    config_dict = cli.model.hparams["config"]
    for attr in ("vocab_size", "src_vocab_size", "tgt_vocab_size"):
        if attr in config_dict:
            assert config_dict[attr] == getattr(cli.datamodule, attr)


# -- checkpoints: resume, foreign and corrupt files -------------------------------------------


class _RecordStart(Callback):
    """Remember the step and optimizer state at the moment training (re)starts."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.global_step = trainer.global_step
        self.optimizer_state = copy.deepcopy(trainer.optimizers[0].state_dict())
        self.lr = trainer.optimizers[0].param_groups[0]["lr"]


def _reverse_args(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "fit",
        "--config",
        str(CONFIGS / "reverse.yaml"),
        "--run.save_dir",
        str(tmp_path / "runs"),
        "--run.logger",
        "csv",
        "--data.init_args.num_train",
        "640",
        "--data.init_args.num_val",
        "64",
        *QUIET,
        *extra,
    ]


def test_resume_from_last_continues_with_the_same_state(tmp_path: Path) -> None:
    from transformer_lab.training.cli import make_cli

    make_cli(_reverse_args(tmp_path, "--trainer.max_steps", "12", "--trainer.max_epochs", "-1"))
    last = tmp_path / "runs" / "reverse" / "version_0" / "checkpoints" / "last.ckpt"
    saved = torch.load(last, map_location="cpu", weights_only=False)
    assert saved["global_step"] == 12
    from transformer_lab.training.cli import find_checkpoint

    assert find_checkpoint("last", tmp_path / "runs" / "reverse") == last
    best = find_checkpoint("best", tmp_path / "runs" / "reverse")
    assert best.name.startswith("best-") and best.parent == last.parent

    recorder = _RecordStart()
    cli = make_cli(
        _reverse_args(
            tmp_path,
            "--trainer.max_steps",
            "15",
            "--trainer.max_epochs",
            "-1",
            "--ckpt_path",
            "last",
        ),
        trainer_defaults={"callbacks": [recorder]},
    )
    assert recorder.global_step == 12
    assert cli.trainer.global_step == 15
    theirs = saved["optimizer_states"][0]
    ours = recorder.optimizer_state
    assert ours["param_groups"][0]["lr"] == pytest.approx(theirs["param_groups"][0]["lr"])
    assert ours["state"].keys() == theirs["state"].keys()
    for key, state in theirs["state"].items():
        torch.testing.assert_close(ours["state"][key]["exp_avg"], state["exp_avg"])
        torch.testing.assert_close(ours["state"][key]["exp_avg_sq"], state["exp_avg_sq"])
        assert float(ours["state"][key]["step"]) == 12
    # The resumed run logs to a new version directory; the old one is untouched.
    assert (tmp_path / "runs" / "reverse" / "version_1" / "checkpoints" / "last.ckpt").exists()


def test_foreign_and_corrupt_checkpoints_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformer_lab.training.cli import run_lightning_cli

    steps = ["--trainer.max_steps", "2", "--trainer.max_epochs", "-1"]
    assert run_lightning_cli(_reverse_args(tmp_path, *steps)) == 0
    last = tmp_path / "runs" / "reverse" / "version_0" / "checkpoints" / "last.ckpt"

    # Same task, another model width: refused before any weight is touched.
    wider = ["--model.init_args.config.d_model", "64", "--ckpt_path", str(last)]
    assert run_lightning_cli(_reverse_args(tmp_path, *steps, *wider)) == 2
    err = capsys.readouterr().err
    assert "d_model: checkpoint 32 vs run 64" in err and "Traceback" not in err

    corrupt = tmp_path / "corrupt.ckpt"
    corrupt.write_bytes(last.read_bytes()[:1000])  # a truncated file
    assert run_lightning_cli(_reverse_args(tmp_path, *steps, "--ckpt_path", str(corrupt))) == 2
    assert "cannot be read" in capsys.readouterr().err

    stranger = tmp_path / "stranger.ckpt"
    torch.save({"state_dict": {}}, stranger)
    assert run_lightning_cli(_reverse_args(tmp_path, *steps, "--ckpt_path", str(stranger))) == 2
    assert "not written by transformer-lab" in capsys.readouterr().err

    empty_root = tmp_path / "elsewhere"
    args = _reverse_args(empty_root, *steps, "--ckpt_path", "last")
    assert run_lightning_cli(args) == 2
    assert "train first" in capsys.readouterr().err


# -- short real training runs -----------------------------------------------------------------


@pytest.mark.slow
def test_char_lm_beats_the_unigram_baseline(tmp_path: Path, tiny_shakespeare_path: Path) -> None:
    """A short run on Tiny Shakespeare gets clearly below the unigram entropy of the text."""
    from collections import Counter

    from transformer_lab.training.cli import make_cli

    text = tiny_shakespeare_path.read_text()
    counts = Counter(text)
    total = sum(counts.values())
    unigram = -sum(c / total * math.log(c / total) for c in counts.values())  # nats, ~3.3
    # The CPU recipe's data and optimizer, with a smaller model and context so it takes seconds.
    small = {
        "model.init_args.config.d_model": 64,
        "model.init_args.config.n_layers": 2,
        "model.init_args.optim.lr": 0.005,
        "model.init_args.optim.warmup_steps": 20,
        "data.init_args.block_size": 32,
        "data.init_args.batch_size": 16,
        "trainer.max_steps": 150,
        "trainer.val_check_interval": 150,
        "trainer.limit_val_batches": 10,
    }
    args = [
        "fit",
        "--config",
        str(CONFIGS / "charlm_cpu.yaml"),
        "--data.init_args.path",
        str(tiny_shakespeare_path),
        "--run.save_dir",
        str(tmp_path / "runs"),
        "--run.logger",
        "csv",
        *QUIET,
        *(f"--{key}={value}" for key, value in small.items()),
    ]
    cli = make_cli(args)
    val_loss = float(cli.trainer.callback_metrics["val_loss"])
    assert val_loss < unigram - 0.5, f"val_loss {val_loss:.3f} vs unigram {unigram:.3f}"


def test_compile_model_compiles_in_place_once_and_keeps_parameter_names(monkeypatch) -> None:
    from transformer_lab.models import GPTConfig
    from transformer_lab.training.modules import CausalLMModule

    calls: list[nn.Module] = []
    monkeypatch.setattr(nn.Module, "compile", lambda self, *a, **k: calls.append(self))
    cfg = GPTConfig(vocab_size=11, n_ctx=8, d_model=16, n_layers=1, n_heads=2)
    eager = CausalLMModule(config=cfg)
    eager.configure_model()
    assert calls == []  # off by default
    module = CausalLMModule(config=cfg, compile_model=True)
    module.configure_model()
    module.configure_model()  # Lightning may call the hook again (e.g. when resuming)
    assert calls == [module.model]
    assert module.hparams["compile_model"] is True
    assert list(module.state_dict()) == list(eager.state_dict())


def _lm_fit(module, **trainer_kwargs) -> L.Trainer:
    """Three steps of next-token training on random tokens, validation and a checkpoint off."""
    torch.manual_seed(0)
    batches = [
        {"tokens": torch.randint(0, 11, (4, 8)), "targets": torch.randint(0, 11, (4, 8))}
        for _ in range(3)
    ]
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **{"gradient_clip_val": 1.0, **trainer_kwargs},
    )
    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None))
    return trainer


class _RecordClipping:
    """Wrap a module's clipping hook: gradient norms (unscaled) before it and after it."""

    def __init__(self, module: L.LightningModule) -> None:
        self.before: list[float] = []
        self.after: list[float] = []
        hook = module.configure_gradient_clipping

        def recorded(optimizer, *args, **kwargs):
            grads = [p.grad for p in module.parameters() if p.grad is not None]
            scaler = getattr(module.trainer.precision_plugin, "scaler", None)
            # Lightning unscales before the hook for a foreach AdamW, not for a fused one.
            scale = scaler.get_scale() if scaler and optimizer.defaults["fused"] else 1.0
            self.before.append(
                float(
                    torch.linalg.vector_norm(
                        torch.stack([torch.linalg.vector_norm(g) for g in grads])
                    )
                )
                / scale
            )
            hook(optimizer, *args, **kwargs)
            self.after.append(
                float(
                    torch.linalg.vector_norm(
                        torch.stack([torch.linalg.vector_norm(g) for g in grads])
                    )
                )
            )

        module.configure_gradient_clipping = recorded


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "foreach"])
def test_fp16_grad_scaler_unscales_then_clips_with_either_adamw(fused: bool) -> None:
    """The T4 recipe (16-mixed: fp16 autocast, a GradScaler, clipping), on the CPU.

    Lightning turns ``precision="16-mixed"`` into bf16 on a CPU; its mixed-precision plugin built
    for fp16 (which makes a real ``torch.amp.GradScaler`` for the CPU) runs the T4's code path.
    Clipping must act on the *unscaled* gradients: after the hook their norm is
    ``min(norm, clip)``, for the fused AdamW (which Lightning does not unscale) as for foreach.
    """
    from lightning.pytorch.plugins import MixedPrecision

    from transformer_lab.models import GPTConfig
    from transformer_lab.training.modules import CausalLMModule, OptimConfig

    cfg = GPTConfig(vocab_size=11, n_ctx=8, d_model=16, n_layers=1, n_heads=2)
    module = CausalLMModule(config=cfg, optim=OptimConfig(fused=fused))
    record = _RecordClipping(module)
    plugin = MixedPrecision("16-mixed", "cpu")
    assert isinstance(plugin.scaler, torch.amp.GradScaler)
    trainer = _lm_fit(module, plugins=[plugin], gradient_clip_val=0.05)
    assert trainer.global_step == 3
    assert bool(trainer.optimizers[0].defaults["fused"]) is fused
    assert len(record.after) == 3
    for before, after in zip(record.before, record.after, strict=True):
        assert after == pytest.approx(min(before, 0.05), rel=1e-3), (before, after)
    assert any(before > 0.05 for before in record.before), "the test must clip something"
    assert all(torch.isfinite(p).all() for p in module.parameters())


def test_bf16_clipping_with_the_fused_adamw_bounds_the_gradient_norm() -> None:
    """bf16 has no scaler: the fused AdamW and clipping simply work together."""
    from transformer_lab.models import GPTConfig
    from transformer_lab.training.modules import CausalLMModule

    cfg = GPTConfig(vocab_size=11, n_ctx=8, d_model=16, n_layers=1, n_heads=2)
    module = CausalLMModule(config=cfg)
    record = _RecordClipping(module)
    trainer = _lm_fit(module, precision="bf16-mixed", gradient_clip_val=0.05)
    assert trainer.optimizers[0].defaults["fused"]
    assert record.after and all(a <= 0.05 * (1 + 1e-3) for a in record.after)
    # Clipping by value goes through the same hook.
    module = CausalLMModule(config=cfg)
    record = _RecordClipping(module)
    _lm_fit(module, gradient_clip_val=1e-4, gradient_clip_algorithm="value")
    assert all(float(p.grad.abs().max()) <= 1e-4 for p in module.parameters() if p.grad is not None)


@pytest.mark.slow
def test_compiled_training_runs_and_its_checkpoint_loads_eagerly(tmp_path: Path) -> None:
    """``compile_model: true`` for real (TorchInductor on the CPU, as on a GPU minus CUDA)."""
    import shutil

    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("TorchInductor needs a C++ compiler on the CPU")
    from transformer_lab.models import GPTConfig
    from transformer_lab.training.modules import CausalLMModule

    # Dropout on, and a validation pass after training (eval mode compiles a second graph).
    cfg = GPTConfig(vocab_size=11, n_ctx=8, d_model=16, n_layers=1, n_heads=2, dropout=0.1)
    module = CausalLMModule(config=cfg, compile_model=True)
    trainer = _lm_fit(module)
    assert trainer.global_step == 3
    val = [{"tokens": torch.randint(0, 11, (4, 8)), "targets": torch.randint(0, 11, (4, 8))}]
    (metrics,) = trainer.validate(module, torch.utils.data.DataLoader(val, batch_size=None))
    assert math.isfinite(metrics["val_loss"])
    trainer.save_checkpoint(tmp_path / "compiled.ckpt")
    eager = CausalLMModule.load_from_checkpoint(tmp_path / "compiled.ckpt")
    tokens = torch.randint(0, 11, (2, 8))
    module.model.eval()
    eager.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(eager.model(tokens), module.model(tokens), atol=1e-5, rtol=1e-4)
