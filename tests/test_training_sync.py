"""How often a step of the kit's training loop makes the host wait for the device.

On a GPU each ``.item()``, ``.tolist()``, ``bool(tensor)`` or copy to the CPU of a device tensor
stops the host until every queued kernel has run, so it cannot queue the next step's kernels
while the GPU works (issue 39: the labs' small models ran slower on an H200 than on a 2-core
CPU). Every such read becomes ``aten::_local_scalar_dense`` (or a device-to-host copy) in the
dispatcher on any device, so a torch profiler trace of a few Lightning steps on the CPU counts
them; speed itself is measured in ``benchmarks/`` (no timed assertions here).

One kind of read in a CPU trace is no synchronisation on a GPU and are left out: the fused AdamW's
reads of its step counters inside its own kernel: on a GPU the counters live on the device and
the kernel reads them there.
"""

from __future__ import annotations

import collections
from typing import Any

import lightning as L
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from transformer_lab.models import GPTConfig
from transformer_lab.training.modules import CausalLMModule, OptimConfig
from transformer_lab.training.trainers import make_trainer

STEPS, FIRST, LAST, EVERY = 14, 4, 13, 5  # profile steps FIRST..LAST; loggers write every EVERY
SYNCS = ("aten::_local_scalar_dense",)  # .item(), .tolist(), bool(), float() of a tensor
INSIDE_THE_OPTIMIZER = "Optimizer.step#"


class _Tokens(torch.utils.data.Dataset):
    """Random next-token windows: ``{"tokens": (T,), "targets": (T,)}``."""

    def __init__(self, n: int, T: int, vocab: int) -> None:
        self.data = torch.randint(0, vocab, (n, T + 1), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"tokens": self.data[i, :-1], "targets": self.data[i, 1:]}


class _ProfileSteps(L.Callback):
    """Profile training steps ``FIRST..LAST`` (after Lightning's and the module's first steps)."""

    def __init__(self) -> None:
        self.profiler = profile(activities=[ProfilerActivity.CPU])

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == FIRST:
            self.profiler.start()

    def on_train_batch_end(self, trainer: Any, module: Any, *args: Any) -> None:
        if trainer.global_step == LAST + 1:
            self.profiler.stop()


def _ancestors(event: Any) -> list[str]:
    names, parent = [], event.cpu_parent
    while parent is not None:
        names.append(parent.name)
        parent = parent.cpu_parent
    return names


def _profile_training(tmp_path: Any, **trainer_options: Any) -> dict[str, Any]:
    """Train a tiny GPT for ``STEPS`` steps; count what steps ``FIRST..LAST`` dispatched."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=32, n_ctx=16, d_model=32, n_layers=2, n_heads=2)
    module = CausalLMModule(config=config, optim=OptimConfig(lr=1e-3, warmup_steps=2))
    loader = torch.utils.data.DataLoader(_Tokens(64, 16, 32), batch_size=4, shuffle=True)
    recorder = _ProfileSteps()
    options: dict[str, Any] = {
        "max_steps": STEPS,
        "accelerator": "cpu",
        "precision": "32-true",
        "logger": L.pytorch.loggers.CSVLogger(tmp_path),
        "log_every_n_steps": EVERY,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "gradient_clip_val": 1.0,
        "callbacks": [recorder],
        "default_root_dir": tmp_path,
    }
    trainer = make_trainer(verbose=False, **(options | trainer_options))
    trainer.fit(module, train_dataloaders=loader)
    events = recorder.profiler.events()
    syncs = collections.Counter()
    for event in events:
        if event.name in SYNCS:
            inside = any(n.startswith(INSIDE_THE_OPTIMIZER) for n in _ancestors(event))
            syncs["optimizer" if inside else "loop"] += 1
    ops = sum(
        1
        for e in events
        if e.name.startswith("aten::") and not any(n.startswith("aten::") for n in _ancestors(e))
    )
    return {"syncs": syncs, "ops_per_step": ops / (LAST - FIRST + 1)}


def test_a_training_step_of_the_kit_synchronises_only_when_the_loggers_write(tmp_path) -> None:
    """Without a progress bar: one read per written step (the logger's number), none between.

    Steps 4..13 with ``log_every_n_steps=5``: the loggers write at steps 4 and 9 (0-based), so
    at most 2 reads in 10 steps (2 measured). Before issue 39 the loop also read ``train_loss``
    back at every step (Lightning converts every ``prog_bar`` value at the end of each step,
    shown or not): 13 in these 10 steps.
    """
    counts = _profile_training(tmp_path)
    written = sum(1 for step in range(FIRST, LAST + 1) if (step + 1) % EVERY == 0)
    assert counts["syncs"]["loop"] <= written, (
        f"{counts['syncs']['loop']} host-device synchronisations in {LAST - FIRST + 1} steps "
        f"(at most {written}: one per step the loggers write)"
    )


def test_the_progress_bar_is_what_costs_a_synchronisation_per_step(tmp_path) -> None:
    """With a bar Lightning reads the shown loss back at every step (22 in 10 steps measured)."""
    pytest.importorskip("tqdm")
    counts = _profile_training(tmp_path, enable_progress_bar=True)
    assert counts["syncs"]["loop"] >= LAST - FIRST + 1


def test_a_training_step_dispatches_a_bounded_number_of_operations(tmp_path) -> None:
    """Kernel launches per step (top-level ATen ops, the CPU's proxy for launches on a GPU).

    A 2-layer GPT step (forward, backward, clipping, fused AdamW, schedule) dispatched about
    280 top-level operations on the CPU (torch 2.13) when this bound was set; a change that adds
    per-step work (a transfer, a metric, an extra copy) shows up here before it shows up on a
    GPU.
    """
    counts = _profile_training(tmp_path)
    assert counts["ops_per_step"] < 400, f"{counts['ops_per_step']:.0f} operations per step"
