"""Learning-rate schedule and optimizer parameter groups for the kit's training runs.

Transformers are usually trained with a short linear warm-up (large early updates through
freshly initialised attention and LayerNorm are unstable with Adam) followed by a cosine decay
to a small floor; see Vaswani et al., "Attention Is All You Need" (2017), section 5.3, and
Loshchilov & Hutter, "SGDR" (2017) for the cosine shape. The schedule here is stepped once per
optimizer step (Lightning ``interval="step"``), so it is independent of the epoch length.

Weight decay follows Loshchilov & Hutter, "Decoupled Weight Decay Regularization" (AdamW, 2019),
applied to weight matrices only: biases and LayerNorm gains are 1-D and are left undecayed.

The optimizer is torch's AdamW, in its *fused* form wherever torch has one for the device (one
kernel updates every parameter; on a 2-core CPU it saves about 2 ms of a 55 ms step of the
laptop char-LM, more on GPUs) and in its multi-tensor ``foreach`` form otherwise. Same
arithmetic, same state: checkpoints move freely between the two. The fused form is used under
every precision, fp16 with its gradient scaler and gradient clipping included (see
:func:`build_adamw`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from transformer_lab.graded import graded

__all__ = [
    "OptimConfig",
    "build_adamw",
    "build_optimizer",
    "warmup_cosine_lambda",
    "warmup_cosine_scheduler",
    "weight_decay_groups",
]


@graded("04_transformer_block")
def warmup_cosine_lambda(
    warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0
) -> Callable[[int], float]:
    """Return the multiplier of the base learning rate as a function of the step.

    The multiplier rises linearly from ``1 / (warmup_steps + 1)`` to 1 over ``warmup_steps``
    steps, then follows half a cosine from 1 down to ``min_lr_ratio`` at ``total_steps`` and stays
    there afterwards.

    Args:
        warmup_steps: number of warm-up steps (0 starts at the full rate).
        total_steps: step at which the cosine reaches its floor; must exceed ``warmup_steps``.
        min_lr_ratio: floor of the multiplier, in ``[0, 1]``.

    Returns:
        A function ``step -> multiplier`` suitable for ``torch.optim.lr_scheduler.LambdaLR``.

    Raises:
        ValueError: if the arguments are inconsistent.
    """
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps={warmup_steps} must be >= 0")
    if total_steps <= warmup_steps:
        raise ValueError(
            f"total_steps={total_steps} must be greater than warmup_steps={warmup_steps}"
        )
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio={min_lr_ratio} must lie in [0, 1]")

    def multiplier(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return min_lr_ratio + (1.0 - min_lr_ratio) * cosine

    return multiplier


@graded("04_transformer_block")
def warmup_cosine_scheduler(
    optimizer: Optimizer, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0
) -> LambdaLR:
    """Wrap :func:`warmup_cosine_lambda` in a ``LambdaLR`` for ``optimizer``.

    Args:
        optimizer: the optimizer whose groups' learning rates are scaled.
        warmup_steps: see :func:`warmup_cosine_lambda`.
        total_steps: see :func:`warmup_cosine_lambda`.
        min_lr_ratio: see :func:`warmup_cosine_lambda`.

    Returns:
        The scheduler; call ``scheduler.step()`` once per optimizer step.
    """
    return LambdaLR(optimizer, warmup_cosine_lambda(warmup_steps, total_steps, min_lr_ratio))


@graded("04_transformer_block")
def weight_decay_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Split ``model``'s trainable parameters into decayed matrices and undecayed vectors.

    Parameters with two or more dimensions (linear weights, embeddings) are decayed; biases and
    LayerNorm parameters (one dimension) are not, since shrinking them toward zero only
    distorts the normalisation and offsets.

    Args:
        model: the module to optimise.
        weight_decay: decay applied to the matrix group (``>= 0``).

    Returns:
        Two AdamW parameter groups: ``[{"params": matrices, "weight_decay": weight_decay},
        {"params": vectors, "weight_decay": 0.0}]``. Tied parameters appear once.

    Raises:
        ValueError: if ``weight_decay`` is negative.
    """
    if weight_decay < 0:
        raise ValueError(f"weight_decay={weight_decay} must be >= 0")
    # named_parameters() yields a tied parameter once, so nothing is optimised twice.
    params = [p for _, p in model.named_parameters() if p.requires_grad]
    matrices = [p for p in params if p.dim() >= 2]
    vectors = [p for p in params if p.dim() < 2]
    return [
        {"params": matrices, "weight_decay": weight_decay},
        {"params": vectors, "weight_decay": 0.0},
    ]


def build_adamw(
    groups: list[dict],
    lr: float,
    betas: tuple[float, float],
    *,
    fused: bool | None = None,
) -> torch.optim.AdamW:
    """Return AdamW over ``groups``, fused where this torch has the kernel for their device.

    The fused kernel works with every precision the kit uses, gradient clipping included: under
    fp16 mixed precision the module unscales the gradients itself before clipping them
    (``configure_gradient_clipping`` of the kit's modules), and torch's ``GradScaler`` then steps
    a fused optimizer with the gradients already unscaled.

    Args:
        groups: parameter groups, e.g. from :func:`weight_decay_groups`.
        lr: learning rate.
        betas: Adam's moment coefficients.
        fused: ``True`` insists on the fused kernel, ``False`` refuses it, ``None`` (automatic)
            uses it wherever torch has it and falls back to the ``foreach`` form elsewhere.

    Raises:
        ValueError: ``fused=True`` on a device for which this torch has no fused AdamW (the
            message names the device), the one case where it cannot work.
    """
    if fused is False:
        return torch.optim.AdamW(groups, lr=lr, betas=betas)
    try:
        return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=True)
    except (RuntimeError, ValueError) as error:  # e.g. CPU parameters before torch 2.4
        if fused:
            devices = sorted({str(p.device) for g in groups for p in g["params"]})
            reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise ValueError(
                f"fused=True: this torch ({torch.__version__}) has no fused AdamW for parameters "
                f"on {', '.join(devices)} ({reason}); leave fused unset (automatic)"
            ) from None
        return torch.optim.AdamW(groups, lr=lr, betas=betas)


@dataclass
class OptimConfig:
    """AdamW and learning-rate schedule settings shared by every module.

    Attributes:
        lr: peak learning rate, reached at the end of warm-up.
        weight_decay: AdamW decay on weight matrices (biases and norms are never decayed).
        betas: Adam's moment coefficients.
        warmup_steps: linear warm-up length in optimizer steps (cut short for very short runs).
        total_steps: step where the cosine reaches its floor; ``None`` uses the Trainer's
            estimate (``max_steps``, or ``max_epochs`` times the batches per epoch).
        min_lr_ratio: floor of the cosine as a fraction of ``lr``.
        fused: AdamW's fused kernel: ``None`` (automatic) uses it wherever torch has one for
            the device, under every precision and with gradient clipping; ``True``/``False``
            force it on/off (see ``schedule.build_adamw``).
    """

    lr: float = 1e-3
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.98)
    warmup_steps: int = 100
    total_steps: int | None = None
    min_lr_ratio: float = 0.1
    fused: bool | None = None

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"lr={self.lr} must be > 0")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay={self.weight_decay} must be >= 0")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps={self.warmup_steps} must be >= 0")
        if self.total_steps is not None and self.total_steps <= 0:
            raise ValueError(f"total_steps={self.total_steps} must be > 0 (or None)")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio={self.min_lr_ratio} must lie in [0, 1]")
        self.betas = tuple(self.betas)  # YAML gives a list


@graded("04_transformer_block")
def build_optimizer(
    model: nn.Module, optim: OptimConfig, estimated_steps: float | None = None
) -> dict[str, Any]:
    """AdamW over ``model`` (decay on matrices only) and its warm-up + cosine schedule.

    What a kit module's ``configure_optimizers`` returns: the optimizer, and the schedule of
    :func:`warmup_cosine_scheduler` stepped after every optimizer step. A run shorter than the
    warm-up (``fast_dev_run``, smoke tests) still gets a valid schedule.

    Args:
        model: the module to optimise.
        optim: the learning rate, decay, betas, warm-up, length and floor of the schedule.
        estimated_steps: the run's length when ``optim.total_steps`` is ``None`` (the Trainer's
            ``estimated_stepping_batches``).

    Returns:
        Lightning's ``{"optimizer": ..., "lr_scheduler": {"scheduler": ..., "interval":
        "step", "frequency": 1}}``.

    Raises:
        ValueError: neither ``optim.total_steps`` nor a finite ``estimated_steps`` is given.
    """
    groups = weight_decay_groups(model, optim.weight_decay)
    optimizer = build_adamw(groups, optim.lr, optim.betas, fused=optim.fused)
    total = optim.total_steps
    if total is None:
        if estimated_steps is None or not math.isfinite(estimated_steps):
            raise ValueError(
                "the learning-rate schedule needs a finite length: set --trainer.max_steps, "
                "--trainer.max_epochs or --model.optim.total_steps"
            )
        total = int(estimated_steps)
    total = max(1, total)
    warmup = min(optim.warmup_steps, total - 1)
    scheduler = warmup_cosine_scheduler(optimizer, warmup, total, optim.min_lr_ratio)
    return {
        "optimizer": optimizer,
        "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1},
    }
