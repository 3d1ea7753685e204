"""What Lightning makes of a ``configure_optimizers``, judged once for every lab that asks for one.

Labs 04 (``TaggingModule``) and 06 (``TranslationModule``) both ask for AdamW with a learning
rate that warms up and decays step by step. The parts of that contract the two labs share are
judged here, with one message each:

* :func:`parse_optimizers` reads the return value the ways Lightning accepts it (an optimizer, a
  dict with ``"optimizer"`` and ``"lr_scheduler"``, ``([optimizer], [scheduler])``, a list of
  one), with the scheduler's ``interval`` and ``frequency``;
* :func:`judge_every_parameter`: every trainable parameter of the module is in the optimizer;
* :func:`judge_stepped_per_step`: the scheduler is stepped once per optimizer step (Lightning's
  default is once per *epoch*, under which a warm-up of N steps lasts N epochs);
* :func:`learning_rates`: the learning rate step by step, with one rate for all parameter
  groups (two groups that drift apart follow two schedules, and a check reading group 0 alone
  would judge only one of them).

What differs stays with each lab: lab 04 judges two weight-decay groups and the exact schedule,
lab 06 the schedule's shape.

Reference: Lightning's ``LightningModule.configure_optimizers`` documentation (the accepted
return values, ``"interval"`` and ``"frequency"``).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from transformer_lab.checks._common import expect_true, kernel_side, run_beside

__all__ = [
    "RETURN_HINT",
    "OptimizerConfig",
    "group_rates",
    "judge_every_parameter",
    "judge_stepped_per_step",
    "learning_rates",
    "parse_optimizers",
]

WHAT = "configure_optimizers()"

RETURN_HINT = (
    'return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}'
)


class OptimizerConfig(NamedTuple):
    """What ``configure_optimizers`` returned, read as Lightning reads it."""

    optimizer: torch.optim.Optimizer
    scheduler: Any
    interval: str
    frequency: int


def _split(conf: Any, what: str) -> tuple[Any, Any]:
    """``(optimizer, scheduler or its config dict)`` from one of Lightning's return forms."""
    if isinstance(conf, Mapping):
        return conf.get("optimizer"), conf.get("lr_scheduler")
    if isinstance(conf, list | tuple) and len(conf) == 2 and isinstance(conf[0], list | tuple):
        optimizers, schedulers = conf
        schedulers = schedulers if isinstance(schedulers, list | tuple) else [schedulers]
        if len(optimizers) != 1 or len(schedulers) != 1:
            raise AssertionError(f"{what} should give one optimizer and one scheduler.")
        return optimizers[0], schedulers[0]
    if isinstance(conf, list | tuple) and len(conf) == 1:
        return _split(conf[0], what) if isinstance(conf[0], Mapping) else (conf[0], None)
    return conf, None


def parse_optimizers(conf: Any, what: str = WHAT) -> OptimizerConfig:
    """Read what ``configure_optimizers`` returned as Lightning does.

    Returns:
        ``(optimizer, scheduler, interval, frequency)``; a scheduler returned without a config
        dict is stepped every ``"epoch"`` (Lightning's default).

    Raises:
        AssertionError: no optimizer, or no scheduler, in what was returned.
    """
    optimizer, scheduler = _split(conf, what)
    interval, frequency = "epoch", 1
    if isinstance(scheduler, Mapping):
        interval = scheduler.get("interval", "epoch")
        frequency = scheduler.get("frequency", 1)
        scheduler = scheduler.get("scheduler")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise AssertionError(
            f"{what} returned {type(conf).__name__}, in which the checks find no optimizer: "
            f"{RETURN_HINT}."
        )
    if scheduler is None:
        raise AssertionError(
            f"{what} returned an optimizer without a learning-rate scheduler: build the warm-up "
            f"and decay from torch.optim.lr_scheduler (LambdaLR) and {RETURN_HINT}."
        )
    expect_true(
        isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler),
        f"{what} gave {type(scheduler).__name__} as the scheduler: use one from "
        "torch.optim.lr_scheduler (LambdaLR, or LinearLR and CosineAnnealingLR in SequentialLR).",
    )
    return OptimizerConfig(optimizer, scheduler, interval, frequency)


def judge_every_parameter(
    optimizer: torch.optim.Optimizer, module: nn.Module, hint: str, what: str = WHAT
) -> None:
    """Every trainable parameter of ``module`` is in one of the optimizer's groups.

    Args:
        hint: how this lab's contract builds the optimizer (said after the names left out).
    """
    given = {id(p) for group in optimizer.param_groups for p in group["params"]}
    trainable = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    missing = [n for n, p in trainable if id(p) not in given]
    if missing:
        shown = ", ".join(missing[:6]) + (", ..." if len(missing) > 6 else "")
        raise AssertionError(
            f"{what}: the optimizer does not update {shown}: it leaves out {len(missing)} of the "
            f"module's {len(trainable)} parameter tensors, which would never be trained. {hint}"
        )


def judge_stepped_per_step(interval: Any, frequency: Any, what: str = WHAT) -> None:
    """The scheduler is stepped after every optimizer step (``"interval": "step"``)."""
    if interval == "step" and frequency == 1:
        return
    per_epoch = ", once per EPOCH," if interval == "epoch" and frequency == 1 else ""
    raise AssertionError(
        f"{what}: Lightning steps your scheduler every {frequency} {interval}(s){per_epoch} "
        "so a warm-up of warmup_steps steps would last warmup_steps epochs in a short run. Ask "
        'for one step per optimizer step: "lr_scheduler": {"scheduler": scheduler, '
        '"interval": "step"}.'
    )


@kernel_side
def group_rates(optimizer: torch.optim.Optimizer, scheduler: Any, steps: int) -> list[list[float]]:
    """The learning rate of every parameter group before each of ``steps`` scheduler steps.

    Run where the optimizer lives (the student's kernel, when judged: one request instead of
    three a step); it returns only numbers, which :func:`learning_rates` judges.
    """
    rates = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "scheduler.step() before optimizer.step()"
        for _ in range(int(steps)):
            rates.append([float(group["lr"]) for group in optimizer.param_groups])
            scheduler.step()
    return rates


def learning_rates(
    optimizer: torch.optim.Optimizer, scheduler: Any, steps: int, what: str = WHAT
) -> Tensor:
    """The learning rate of each of the first ``steps`` optimizer steps, ``(steps,)`` float64.

    Only the scheduler steps (as Lightning steps it after each training step): no parameter
    changes, and the rates are read from every group before each step.

    Raises:
        AssertionError: the parameter groups have different learning rates at some step.
    """
    rates = run_beside(optimizer, group_rates, optimizer, scheduler, steps)
    expect_true(
        isinstance(rates, list) and len(rates) == steps,
        f"{what}: the schedule could not be read for {steps} steps",
    )
    for step, group_rates_now in enumerate(rates):
        values = [float(r) for r in group_rates_now]
        expect_true(
            bool(values) and max(values) - min(values) <= 1e-12 * max(abs(r) for r in values),
            f"{what}: at step {step} the parameter groups have different learning rates "
            f"{sorted(set(values))}: give every group the same lr (one schedule for the model).",
        )
    return torch.tensor([float(r[0]) for r in rates], dtype=torch.float64)  # (steps,)
