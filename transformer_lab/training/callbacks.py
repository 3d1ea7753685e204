"""Callbacks of the training CLI: show what the trained model does with unseen examples.

:class:`RunCheckpoint` is Lightning's ``ModelCheckpoint`` that also writes ``last.ckpt`` when a
run stops between epochs (``--trainer.max_steps``), so ``--ckpt_path last`` resumes from the step
where training actually stopped.

A falling loss is an abstract reward; seeing the model reverse a sequence it never saw is the
concrete one. :class:`ShowExamples` runs at the end of ``fit`` and prints a few validation
examples (input, prediction, target) with the model in its final state, then where the
checkpoints were written. It costs one validation batch, once.

Decoding of ids to text goes through the DataModule when it knows how (``decode`` or a
``tokenizer``), else ids are printed as numbers.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import Tensor

__all__ = ["RunCheckpoint", "ShowExamples", "make_decoder"]


def make_decoder(datamodule: Any) -> Callable[[Sequence[int]], str]:
    """Return ``ids -> text`` for the DataModule's vocabulary.

    Uses ``datamodule.decode`` if present, else ``datamodule.tokenizer.decode``, else prints the
    ids separated by spaces.

    Args:
        datamodule: the run's DataModule (or ``None``).

    Returns:
        A function from a list of token ids to a printable string.
    """
    for owner in (datamodule, getattr(datamodule, "tokenizer", None)):
        decode = getattr(owner, "decode", None)
        if callable(decode):
            return lambda ids: str(decode(list(ids)))
    return lambda ids: " ".join(str(int(i)) for i in ids)


def _to_device(batch: dict[str, Tensor], device: torch.device) -> dict[str, Tensor]:
    return {k: v.to(device) if isinstance(v, Tensor) else v for k, v in batch.items()}


class ShowExamples(Callback):
    """At the end of ``fit``, print ``num_examples`` validation examples and the checkpoints.

    Args:
        num_examples: how many examples to show (0 disables the callback).
    """

    def __init__(self, num_examples: int = 4) -> None:
        if num_examples < 0:
            raise ValueError(f"num_examples={num_examples} must be >= 0")
        self.num_examples = num_examples

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero or self.num_examples == 0 or trainer.sanity_checking:
            return
        if getattr(trainer, "fast_dev_run", False):
            return
        out = sys.stdout
        datamodule = getattr(trainer, "datamodule", None)
        examples_fn = getattr(pl_module, "examples", None)
        if datamodule is not None and callable(examples_fn):
            loader = datamodule.val_dataloader()
            batch = _to_device(next(iter(loader)), pl_module.device)
            was_training = pl_module.training
            pl_module.eval()
            try:
                rows = examples_fn(batch, self.num_examples)
            finally:
                pl_module.train(was_training)
            decode = make_decoder(datamodule)
            print(f"\n{len(rows)} validation examples (never seen in training):", file=out)
            for row in rows:
                mark = "ok " if row["prediction"] == row["target"] else "ERR"
                print(f"  [{mark}] input      {decode(row['input'])}", file=out)
                show = (lambda ids: str(ids)) if row.get("labels") else decode
                print(f"        prediction {show(row['prediction'])}", file=out)
                print(f"        target     {show(row['target'])}", file=out)
        for callback in trainer.checkpoint_callbacks:
            if isinstance(callback, ModelCheckpoint):
                if callback.best_model_path:
                    print(f"best checkpoint: {callback.best_model_path}", file=out)
                if callback.last_model_path:
                    print(f"last checkpoint: {callback.last_model_path}", file=out)
        out.flush()


class RunCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose ``last.ckpt`` is always the state at the end of training.

    Lightning saves ``last`` at epoch ends (and once at the end of a run that never saved one);
    a run cut short by ``max_steps`` in the middle of an epoch would otherwise leave a ``last``
    from the previous epoch end, and a resumed run would silently repeat those steps.
    """

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        if (
            self.save_last
            and not trainer.fast_dev_run
            and getattr(self, "_last_global_step_saved", trainer.global_step) != trainer.global_step
        ):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
