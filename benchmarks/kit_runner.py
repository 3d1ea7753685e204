"""Glue between the benchmarks and the kit's training layer (GPT, ``CausalLMModule``, Trainer).

Two ways to get a kit training run:

* :func:`lightning_run` builds ``CausalLMModule`` + ``lightning.Trainer`` directly for a given
  ``GPTConfig`` and optimiser, fed by the same random-window batches as the plain loop, with a
  callback that times the steady state (used by the throughput benchmark: any gap is the
  LightningModule/Trainer overhead);
* :func:`build_from_config` reads one of the kit's YAML recipes through the kit's own
  ``LightningCLI`` (without running it), so the quality benchmark trains exactly what
  ``transformer-lab fit --config configs/bench_charlm_cpu.yaml`` would.

Reference: Lightning's ``Trainer`` and ``LightningCLI`` documentation.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from reference_gpt import CharData, get_batch
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset


class RandomWindows(IterableDataset):
    """Endless random training windows, already batched, as ``"lm"`` dicts.

    The same sampler as the plain loop (``reference_gpt.get_batch``) so both sides see the same
    data at the same cost.
    """

    def __init__(self, data: Tensor, batch_size: int, block: int, seed: int) -> None:
        super().__init__()
        self.data, self.batch_size, self.block, self.seed = data, batch_size, block, seed

    def __iter__(self) -> Iterator[dict[str, Tensor]]:
        gen = torch.Generator().manual_seed(self.seed)
        while True:
            x, y = get_batch(self.data, self.batch_size, self.block, gen)
            yield {"tokens": x, "targets": y}


class StepTimer:
    """Lightning callback: wall time from the start of batch ``skip`` to the end of training.

    It also keeps the clock at the start of every batch and at the end (``stamps``), the same
    stamps the plain loop records, so per-step intervals can be compared one to one.
    """

    def __init__(self, skip: int, device: torch.device) -> None:
        import lightning as L

        outer = self

        class _CB(L.Callback):
            def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
                outer._sync()
                outer.stamps.append(time.perf_counter())
                if trainer.global_step == outer.skip and outer.t0 is None:
                    outer._sync()
                    outer.t0, outer.c0 = time.perf_counter(), time.process_time()

            def on_train_end(self, trainer: Any, *args: Any) -> None:
                outer._sync()
                outer.t1, outer.c1 = time.perf_counter(), time.process_time()
                outer.stamps.append(outer.t1)

        self.skip, self.device = skip, device
        self.t0: float | None = None
        self.t1: float | None = None
        self.c0 = self.c1 = 0.0  # process CPU time at t0 and t1
        self.stamps: list[float] = []
        self.callback = _CB()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @property
    def seconds(self) -> float:
        if self.t0 is None or self.t1 is None:
            raise RuntimeError("the timed window was never entered: steps <= skip?")
        return self.t1 - self.t0


def trainer_kwargs(device: torch.device, precision: str) -> dict[str, Any]:
    """Trainer options for a benchmark run: no progress bar, logger, summary or checkpoints."""
    return {
        "accelerator": "gpu" if device.type == "cuda" else "cpu",
        "devices": 1,
        "precision": precision,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
        "logger": False,
        "log_every_n_steps": 50,
        "num_sanity_val_steps": 0,
        "limit_val_batches": 0,
    }


def lightning_run(
    gpt_kwargs: dict[str, Any],
    optim_kwargs: dict[str, Any],
    data: CharData,
    *,
    batch_size: int,
    steps: int,
    skip: int,
    device: torch.device,
    precision: str,
    grad_clip: float,
    seed: int,
) -> dict[str, float]:
    """Train the kit's GPT for ``steps`` steps through ``CausalLMModule`` and a ``Trainer``.

    Returns:
        ``{"tokens_per_s", "seconds"}`` over the steps after the first ``skip``.
    """
    import lightning as L

    from transformer_lab.models import GPTConfig
    from transformer_lab.training.modules import CausalLMModule, OptimConfig
    from transformer_lab.training.trainers import quiet_lightning

    quiet_lightning()  # the logs gpu.sh brings back stay readable
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=data.vocab_size, **gpt_kwargs)
    module = CausalLMModule(config=cfg, optim=OptimConfig(**optim_kwargs, total_steps=steps))
    loader = DataLoader(
        RandomWindows(data.train, batch_size, cfg.n_ctx, seed),
        batch_size=None,
        pin_memory=device.type == "cuda",
    )
    timer = StepTimer(skip, device)
    trainer = L.Trainer(
        max_steps=steps,
        callbacks=[timer.callback],
        gradient_clip_val=grad_clip or None,
        **trainer_kwargs(device, precision),
    )
    trainer.fit(module, train_dataloaders=loader)
    seconds = timer.seconds
    tokens = batch_size * cfg.n_ctx
    return {
        "tokens_per_s": (steps - skip) * tokens / seconds,
        "median_step_tokens_per_s": tokens / median_interval(timer.stamps, skip),
        "cpu_tokens_per_s": (steps - skip) * tokens / (timer.c1 - timer.c0),
        "seconds": seconds,
    }


def median_interval(stamps: list[float], skip: int) -> float:
    """Median time between consecutive stamps, leaving out the first ``skip`` intervals."""
    gaps = [b - a for a, b in zip(stamps[skip:], stamps[skip + 1 :], strict=False)]
    if not gaps:
        raise ValueError(f"{len(stamps)} stamps leave no interval after skip={skip}")
    return statistics.median(gaps)


@dataclass
class KitRun:
    """A kit training run built from a YAML recipe, ready for ``trainer.fit``."""

    trainer: Any
    module: Any
    datamodule: Any

    @property
    def model(self) -> torch.nn.Module:
        """The plain model inside the LightningModule."""
        return self.module.model


def build_from_config(
    config: Path,
    device: torch.device,
    *,
    root_dir: Path,
    overrides: list[str],
) -> KitRun:
    """Instantiate (without running) the kit's ``LightningCLI`` as ``fit --config config`` would.

    The benchmark adds: the accelerator, one device, no progress bar, logger or model summary,
    and ``root_dir`` for checkpoints; ``overrides`` (CLI words) come last and win.
    """
    import lightning as L

    from transformer_lab.training.cli import TransformerLabCLI

    args = [
        "--config",
        str(config),
        f"--trainer.accelerator={'gpu' if device.type == 'cuda' else 'cpu'}",
        "--trainer.devices=1",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.logger=false",
        f"--trainer.default_root_dir={root_dir}",
        "--examples.num_examples=0",
        *overrides,
    ]
    # LightningCLI warns when given args while the process has its own argv: hide ours.
    saved_argv, sys.argv = sys.argv, sys.argv[:1]
    try:
        cli = TransformerLabCLI(
            L.LightningModule,
            L.LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            seed_everything_default=0,
            save_config_callback=None,
            parser_kwargs={"default_env": False},
            run=False,
            args=args,
        )
    finally:
        sys.argv = saved_argv
    return KitRun(trainer=cli.trainer, module=cli.model, datamodule=cli.datamodule)
