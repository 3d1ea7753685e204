"""The LightningModule contract labs 04 and 06 share, judged once for both.

Labs 04 (``TaggingModule``) and 06 (``TranslationModule``) build the student's module around
the check's model the same way (:func:`build_module`) and both ask for a ``training_step``
that returns and logs the loss (:func:`judge_training_step`, called without a Trainer, its
``self.log`` calls recorded) and a ``configure_optimizers`` whose learning rate warms up and
decays step by step (:func:`judge_configure_optimizers`, what it returns read as Lightning reads
it by :func:`parse_optimizers`), with one message each. What differs stays with each lab, as
data: the expected loss and its mistakes, lab 04's two weight-decay groups and exact warm-up +
cosine (its oracle is hidden), lab 06's schedule shape.

Reference: Lightning's ``LightningModule`` documentation (``training_step``, ``self.log``,
``configure_optimizers``: the accepted return values, ``"interval"`` and ``"frequency"``).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from transformer_lab.checks._common import (
    Ban,
    call_forbidding,
    close,
    compare,
    expect_module,
    expect_true,
    instance_attributes,
    kernel_side,
    run_beside,
)

__all__ = [
    "Schedule",
    "build_module",
    "judge_configure_optimizers",
    "judge_stepped_per_step",
    "judge_training_step",
    "learning_rates",
    "parse_optimizers",
    "run_training_step",
]

WHAT = "configure_optimizers()"
STEP = "training_step(batch, 0)"

RETURN_HINT = (
    'return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}'
)


class Schedule(NamedTuple):
    """The learning-rate schedule a module's hyper-parameters ask for: a linear warm-up to
    ``lr`` over ``warmup_steps`` optimizer steps, then a decay that ends at ``total_steps``."""

    lr: float
    warmup_steps: int
    total_steps: int

    def __str__(self) -> str:
        return f"(lr={self.lr:g}, warmup_steps={self.warmup_steps}, total_steps={self.total_steps})"


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


def build_module(cls: Any, name: str, *args: Any, ban: Ban, **hparams: Any) -> Any:
    """``cls(*args, **hparams)`` under ``ban``, ``args`` the check's model first (``name``: the
    class the notebook asks for, as messages call it): the student's LightningModule."""
    shown = ["model", *map(repr, args[1:]), *(f"{k}={v!r}" for k, v in hparams.items())]
    what = f"{name}({', '.join(shown)})"
    return expect_module(call_forbidding(cls, args, hparams, ban=ban, what=what), what)


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


def judge_adamw(
    optimizer: torch.optim.Optimizer, model: nn.Module, lr: float, weight_decay: float
) -> None:
    """AdamW over every parameter once: ``weight_decay`` on the matrices, none on biases and
    norms, and the peak learning rate ``lr`` in every group."""
    if not isinstance(optimizer, torch.optim.AdamW):
        raise AssertionError(
            f"{WHAT} builds {type(optimizer).__name__}: use torch.optim.AdamW. "
            + (
                "Adam's weight_decay adds the decay to the gradient, where Adam's division by "
                "the gradient's running size distorts it (weights with large gradients are "
                "hardly decayed); AdamW decays the weights directly (decoupled)."
                if isinstance(optimizer, torch.optim.Adam)
                else ""
            )
        )
    judge_every_parameter(
        optimizer,
        model,
        "Give it every parameter of the module (self.parameters()), split into two groups.",
    )
    groups = optimizer.param_groups  # read once (the judge asks the kernel for it)
    decay_of = {id(p): g.get("weight_decay", 0.0) for g in groups for p in g["params"]}
    wrong = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        decay = decay_of[id(param)]
        want = weight_decay if param.dim() >= 2 else 0.0
        if abs(decay - want) > 1e-12:
            wrong.append((name, param.dim(), decay, want))
    if wrong:
        shown = "; ".join(
            f"{n} ({d}-D) has weight_decay={w:g}, expected {e:g}" for n, d, w, e in wrong
        )
        raise AssertionError(
            f"{WHAT}: {shown}. Decay the weight matrices and the embedding (p.dim() >= 2) with "
            "weight_decay, and nothing with one dimension (biases, LayerNorm weights and "
            "biases): shrinking a norm's gain or a bias towards 0 is no regularisation."
        )
    peaks = {g.get("initial_lr", g["lr"]) for g in groups}
    expect_true(
        all(abs(peak - lr) <= 1e-12 + 1e-6 * lr for peak in peaks),
        f"{WHAT}: the optimizer's learning rate is {sorted(peaks)}, expected lr={lr:g}: use "
        "self.hparams.lr.",
    )


def _judge_exact_rates(
    rates: Tensor, schedule: Schedule, expected: Tensor, mistakes: Sequence[tuple[Tensor, str]]
) -> None:
    """The rates are ``expected`` (a linear warm-up from ``lr / warmup_steps``, then a cosine
    to 0 at ``total_steps``); a catalogued wrong schedule is named."""
    lr, warmup, total = schedule
    compare(
        rates,
        expected,
        what=f"the learning rates of steps 0..{total - 1} for lr={lr:g}, "
        f"warmup_steps={warmup:g}, total_steps={total:g}",
        candidates=mistakes,
        hint="Expected lr * (step + 1) / warmup_steps for the first warmup_steps steps, then a "
        "cosine from lr at step warmup_steps down to 0 at step total_steps.",
        atol=1e-10,
        rtol=1e-5,
    )


def _judge_rates_shape(rates: Tensor, schedule: Schedule) -> None:
    """A warm-up from below ``lr / 4`` up to ``lr`` (not ``lr**2``) that ends at
    ``warmup_steps``, then a decay to at most ``lr / 2`` by ``total_steps``, never going up and
    down; any curve of that shape (linear, cosine) passes."""
    r = rates.double()
    lr, warmup_steps, total_steps = schedule
    peak, top = float(r.max()), int(r.argmax())
    rising, falling = r[: top + 1], r[top:]
    shaped = (
        abs(peak - lr) <= 0.02 * lr
        and float(r[0]) <= 0.25 * lr
        and abs(top - warmup_steps) <= max(2, warmup_steps // 10)
        and not bool((rising[1:] < rising[:-1] - 1e-12).any())
        and not bool((falling[1:] > falling[:-1] + 1e-12).any())
        and float(r[-1]) <= 0.5 * lr
    )
    expect_true(
        shaped,
        f"your learning rate starts at {float(r[0]):.3g}, peaks at {peak:.3g} at step {top} and "
        f"ends at {float(r[-1]):.3g} at step {total_steps - 1} {schedule}: expected a linear "
        "rise from near 0 to self.lr at step self.warmup_steps, then a decay (cosine or linear) "
        "toward 0 by self.total_steps. LambdaLR multiplies the optimizer's lr by your function: "
        "it returns a factor between 0 and 1.",
    )


def judge_configure_optimizers(
    module: Any,
    model: nn.Module,
    schedule: Schedule,
    *,
    ban: Ban,
    weight_decay: float | None = None,
    expected: Tensor | None = None,
    mistakes: Sequence[tuple[Tensor, str]] = (),
    on_error: str = "",
) -> Tensor:
    """``module.configure_optimizers()`` under ``ban``, read as Lightning reads it and judged in
    the order a student meets the contract: the optimizer (AdamW with two weight-decay groups
    when ``weight_decay`` is given, else any optimizer over every parameter of ``model``), the
    scheduler stepped per step, then the rates: ``expected`` (the exact rates, stored in the
    visible fixtures or the hidden oracle's, a catalogued wrong schedule in ``mistakes`` named),
    or without it the schedule's shape.

    Returns:
        The learning rates of the first ``schedule.total_steps`` steps, ``(total_steps,)``.
    """
    returned = call_forbidding(
        module.configure_optimizers, (), {}, ban=ban, what=WHAT, on_error=on_error
    )
    optimizer, scheduler, interval, frequency = parse_optimizers(returned)
    if weight_decay is None:
        judge_every_parameter(
            optimizer, model, "Give it all: torch.optim.AdamW(self.parameters(), lr=self.lr)."
        )
    else:
        judge_adamw(optimizer, model, schedule.lr, weight_decay)
    judge_stepped_per_step(interval, frequency)
    rates = learning_rates(optimizer, scheduler, schedule.total_steps)
    if expected is None:
        _judge_rates_shape(rates, schedule)
    else:
        _judge_exact_rates(rates, schedule, expected, mistakes)
    return rates


# --------------------------------------------------------------------------------------
# training_step
# --------------------------------------------------------------------------------------


@dataclass
class LogCall:
    """One ``self.log(name, value, **options)`` call of a ``training_step``."""

    name: str
    value: Any
    options: dict[str, Any] = field(default_factory=dict)


def run_training_step(module: Any, batch: dict[str, Tensor], ban: Ban) -> tuple[Any, list[LogCall]]:
    """``module.training_step(batch, 0)`` under ``ban``, without a Trainer; what it returned and
    what it logged."""
    calls: list[LogCall] = []

    def log(name: str, value: Any, *args: Any, **options: Any) -> None:
        calls.append(LogCall(name, value, options))

    def log_dict(values: Mapping[str, Any], *args: Any, **options: Any) -> None:
        calls.extend(LogCall(name, value, options) for name, value in values.items())

    module.train()
    module.log, module.log_dict = log, log_dict  # on the instance only
    try:
        out = call_forbidding(module.training_step, (batch, 0), {}, ban=ban, what=STEP)
    finally:
        for name in ("log", "log_dict"):
            with contextlib.suppress(AttributeError):
                delattr(module, name)
    return out, calls


def graph_holders(module: nn.Module) -> list[str]:
    """Attributes of ``module`` that keep tensors with an autograd graph (``self.losses[3]``...)."""
    found: list[str] = []

    def visit(value: Any, path: str, depth: int) -> None:
        if isinstance(value, Tensor):
            if value.requires_grad:  # a graph (or a leaf that starts one) is kept alive
                found.append(path)
        elif depth < 3 and isinstance(value, list | tuple):
            for i, item in enumerate(value[:1000]):
                visit(item, f"{path}[{i}]", depth + 1)
        elif depth < 3 and isinstance(value, dict):
            for key, item in list(value.items())[:1000]:
                visit(item, f"{path}[{key!r}]", depth + 1)

    for name, value in instance_attributes(module).items():
        if name not in ("_parameters", "_buffers", "_modules"):
            visit(value, f"self.{name}", 0)
    return found


def judge_training_loss(
    out: Any, expected: Tensor, mistakes: Sequence[tuple[Tensor, str]], hint: str
) -> Tensor:
    """The returned loss: a scalar tensor with its graph, equal to ``expected`` (a catalogued
    wrong loss named); ``hint`` says how the lab's loss is computed."""
    loss = out.get("loss") if isinstance(out, Mapping) else out
    if isinstance(loss, float | int):
        raise AssertionError(
            f"{STEP} returned the number {loss:.4g}: return the loss tensor itself (Lightning "
            "calls loss.backward() on it), not loss.item()."
        )
    expect_true(
        isinstance(loss, Tensor),
        f"{STEP} returned {type(out).__name__}: return the loss tensor (or {{'loss': loss}}).",
    )
    expect_true(
        loss.dim() == 0,
        f"{STEP} returned a loss of shape {tuple(loss.shape)}: average it to one number "
        "(the mean over the real tokens).",
    )
    expect_true(
        loss.requires_grad and loss.grad_fn is not None,
        f"{STEP} returned a loss without its autograd graph (detached, or rebuilt from "
        "loss.item()): return the loss as computed, so that Lightning can call backward().",
    )
    return compare(
        loss,
        expected,
        what=f"the loss {STEP} returned",
        candidates=mistakes,
        hint=hint,
        atol=1e-5,
        rtol=1e-5,
    )


def judge_logging(calls: Sequence[LogCall], loss: Tensor, module: nn.Module) -> None:
    """``self.log("train_loss", ...)``: once, the loss's value, a tensor whose graph is not kept."""
    names = [c.name for c in calls]
    ours = [c for c in calls if c.name == "train_loss"]
    if not ours:
        raise AssertionError(
            f"{STEP} logged {names or 'nothing'}: log the loss under the name 'train_loss' "
            "(self.log('train_loss', loss.detach())); the notebook's plots read that name."
        )
    expect_true(
        len(ours) == 1, f"{STEP} logged 'train_loss' {len(ours)} times: log it once per step."
    )
    call = ours[0]
    if isinstance(call.value, float | int):
        raise AssertionError(
            f"{STEP} logged a Python number ({call.value:.4g}, from .item()): on a GPU .item() "
            "makes the CPU wait for the GPU at every step. Log the tensor, detached: "
            "self.log('train_loss', loss.detach())."
        )
    expect_true(
        isinstance(call.value, Tensor) and call.value.numel() == 1,
        f"{STEP} logged {type(call.value).__name__} as 'train_loss': log the loss tensor.",
    )
    expect_true(
        close(call.value.detach().reshape(()), loss.detach()),
        f"{STEP} logged {float(call.value.detach()):.4g} as 'train_loss' but returned the loss "
        f"{float(loss.detach()):.4g}: log the loss you return.",
    )
    if call.options.get("enable_graph") and call.value.requires_grad:
        raise AssertionError(
            f"{STEP} logs the loss with enable_graph=True: the logger then keeps the step's whole "
            "autograd graph alive. Log loss.detach() (without enable_graph)."
        )
    expect_true(
        call.options.get("on_step", True) is not False,
        f"{STEP} logs 'train_loss' with on_step=False: the loss curves need one value per step "
        "(the default in training_step).",
    )
    holders = graph_holders(module)
    expect_true(
        not holders,
        f"after {STEP}, {', '.join(holders[:3])} holds a tensor with its autograd graph: every "
        "step's activations stay in memory and the run slows down and runs out of memory. "
        "Store loss.detach() (or nothing: self.log keeps the curve).",
    )


def judge_training_step(
    module: Any,
    batch: dict[str, Tensor],
    *,
    ban: Ban,
    expected: Tensor,
    mistakes: Sequence[tuple[Tensor, str]],
    hint: str,
) -> Tensor:
    """``module.training_step(batch, 0)`` under ``ban``: the loss it returns
    (:func:`judge_training_loss`), then what it logs and keeps (:func:`judge_logging`).

    Returns:
        The returned loss, its graph kept (a hidden check may call ``backward`` on it).
    """
    out, calls = run_training_step(module, batch, ban)
    loss = judge_training_loss(out, expected, mistakes, hint)
    judge_logging(calls, loss, module)
    return loss
