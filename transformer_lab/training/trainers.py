"""A Lightning ``Trainer`` set up for the device at hand, without noise a student cannot act on.

The labs and the CLI build their trainers through this module so that every GPU a student gets
(a Colab T4, an A100, an H100/H200, or none) trains with the right numerics and prints only what
matters:

* :func:`make_trainer`: ``lightning.Trainer`` with the accelerator and precision chosen for the
  device (``bf16-mixed`` on GPUs with bfloat16, ``16-mixed`` on a T4, ``32-true`` on CPU and
  Apple MPS; see :mod:`.devices`), TF32 matrix products on CUDA, the atomic checkpoint writer,
  and one line saying what was chosen. Every keyword is passed to ``Trainer`` and wins.
* :func:`use_tensor_cores`: ``torch.set_float32_matmul_precision("high")`` when a trainer runs
  on CUDA, so float32 matrix products (an fp32 run, and the float32 parts of a mixed one) use
  the tensor cores in TF32. Lightning otherwise warns about it on every run.
* :func:`quiet_lightning`: hides three messages that say nothing about the student's run: the
  advertisement for Lightning's cloud logger, a deprecation inside Lightning
  (``isinstance(treespec, LeafSpec)``, raised by newer torch releases), and the advice to add
  DataLoader workers, which only slows the kit's in-memory datasets down.
* :func:`lightning_logs_off`: Lightning's own log lines (devices, tips) silenced while a block
  runs, its levels restored after: for the checks, whose Trainers are theirs, not the student's.
* :data:`BARE`: the ``Trainer`` options of a run that only computes (no logger, checkpoint,
  progress bar or model summary), as the checks and the tests build one.

Reference: the Lightning docs, "N-bit precision" and "Warnings"; torch's
``set_float32_matmul_precision``.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

__all__ = ["BARE", "lightning_logs_off", "make_trainer", "quiet_lightning", "use_tensor_cores"]

#: ``Trainer`` options of a run that only computes: nothing logged, saved or printed.
BARE: Mapping[str, Any] = MappingProxyType(
    {
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
)

# Messages (regular expressions matched at the start) that a student can do nothing about.
_QUIET_WARNINGS = (
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    r"The '\w+' does not have many workers",
)
_RANK_ZERO_LOGGERS = (
    "lightning.pytorch.utilities.rank_zero",
    "lightning.fabric.utilities.rank_zero",
)


class _DropTips(logging.Filter):
    """Drop Lightning's advertisement for its cloud logger ("Tip: ... litlogger ...")."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in record.getMessage()


_DROP_TIPS = _DropTips()


def quiet_lightning() -> None:
    """Hide Lightning's messages that a student cannot act on; idempotent.

    Warnings and log records that do say something about the run (a missing metric, a
    too-long logging interval, anything from the kit) are kept. The filters are process-wide,
    like every ``warnings`` filter: call this once at the top of a script or notebook.
    """
    for message in _QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    for name in _RANK_ZERO_LOGGERS:
        logging.getLogger(name).addFilter(_DROP_TIPS)  # adding the same filter twice is a no-op


@contextlib.contextmanager
def lightning_logs_off() -> Iterator[None]:
    """Silence Lightning's own log lines (devices, tips) inside the block; every other logger
    (a student's own) still shows its warnings, and Lightning's levels come back after."""
    with contextlib.ExitStack() as restore:
        for logger in map(logging.getLogger, ("lightning.pytorch", "lightning.fabric")):
            restore.callback(logger.setLevel, logger.level)  # its own level back, come what may
            logger.setLevel(logging.ERROR)
        yield


def use_tensor_cores(trainer: Any) -> bool:
    """Let float32 matrix products use TF32 when ``trainer`` runs on a CUDA GPU.

    Args:
        trainer: a ``lightning.Trainer``.

    Returns:
        True when the trainer uses CUDA (and TF32 is now allowed), else False (nothing changed).
    """
    from lightning.pytorch.accelerators import CUDAAccelerator

    if not isinstance(trainer.accelerator, CUDAAccelerator):
        return False
    import torch

    torch.set_float32_matmul_precision("high")
    return True


def make_trainer(*, verbose: bool = True, **trainer_kwargs: Any) -> Any:
    """Build a ``lightning.Trainer`` for this machine: device, precision, TF32, quiet.

    Args:
        verbose: print one line naming the device and the precision chosen.
        **trainer_kwargs: any ``lightning.Trainer`` argument (``max_epochs=3``,
            ``precision="32-true"``, ``accelerator="cpu"``, ...); given ones always win.
            Unless given, ``accelerator`` is ``"auto"`` and ``precision`` the device's best
            (:func:`~transformer_lab.training.devices.choose_precision`).

    Returns:
        The trainer, e.g. ``make_trainer(max_epochs=3).fit(module, datamodule=dm)``.

    Raises:
        ValueError: for an accelerator name the kit does not know (``"tpu"``).
    """
    import lightning as L

    from transformer_lab.training.callbacks import AtomicCheckpointIO
    from transformer_lab.training.devices import choose_precision, device_description

    quiet_lightning()
    accelerator = trainer_kwargs.setdefault("accelerator", "auto")
    device = accelerator if isinstance(accelerator, str) and accelerator != "auto" else None
    trainer_kwargs.setdefault("precision", choose_precision(device))
    if "plugins" not in trainer_kwargs:
        trainer_kwargs["plugins"] = [AtomicCheckpointIO()]
    trainer = L.Trainer(**trainer_kwargs)
    tf32 = use_tensor_cores(trainer)
    if verbose:
        kind = type(trainer.accelerator).__name__.removesuffix("Accelerator").lower()
        where = device_description(kind) if kind in ("cuda", "mps", "cpu") else kind
        print(
            f"transformer-lab: training on {where} in {trainer.precision} precision"
            + (", TF32 matrix products" if tf32 and trainer.precision.startswith("32") else ""),
            file=sys.stdout,
            flush=True,
        )
    return trainer
