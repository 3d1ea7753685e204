"""Callbacks and the checkpoint writer of the training CLI: runs that end cleanly and lose nothing.

* :class:`RunCheckpoint`: Lightning's ``ModelCheckpoint`` whose ``last.ckpt`` is always the state
  where training stopped: at ``max_steps`` in the middle of an epoch, and on Ctrl-C (a
  ``KeyboardInterrupt``) wherever it lands, so ``--ckpt_path last`` resumes from that step and no
  step is trained or logged twice. Under ``fast_dev_run`` it writes nothing, as Lightning intends.
* :class:`StopOnInterrupt`: the first Ctrl-C of a single-process ``fit`` finishes the step in
  progress, validates and saves, then stops (a second Ctrl-C aborts at once).
* :class:`ValidateOnLastStep`: a run cut short by ``max_steps`` between two validations still
  validates once at its last step, so its checkpoint records the metric it monitors.
* :class:`ShowExamples`: at the end of ``fit``, a few validation examples (input, prediction,
  target) with the model in its final state, then where the checkpoints were written. A falling
  loss is an abstract reward; seeing the model reverse a sequence it never saw is the concrete
  one. It costs one validation batch, once.
* :class:`AtomicCheckpointIO`: checkpoints are written to a temporary file beside the target and
  renamed into place; nothing is left in ``$TMPDIR``, and a failed save leaves no partial file.

Decoding of ids to text goes through the DataModule when it knows how (``decode`` or a
``tokenizer``), else ids are printed as numbers.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from torch import Tensor

from transformer_lab.graded import LockedAnswerError

__all__ = [
    "AtomicCheckpointIO",
    "RunCheckpoint",
    "ShowExamples",
    "StopOnInterrupt",
    "ValidateOnLastStep",
    "make_decoder",
]


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


def _one_line(text: str) -> str:
    """``text`` on one line: newlines shown as ``\\n`` so that the columns stay aligned."""
    return text.replace("\r", "").replace("\n", "\\n")


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
            except LockedAnswerError as error:
                # A student package before the deadline of the lab that grades decoding: the
                # run itself is finished and saved, so say why there are no examples and stop.
                print(f"\nno validation examples: {error}", file=out)
                return
            finally:
                pl_module.train(was_training)
            decode = make_decoder(datamodule)

            def text(ids: Sequence[int]) -> str:
                return _one_line(decode(ids))

            free = [row for row in rows if row.get("free")]
            scored = [row for row in rows if not row.get("free")]
            if scored:
                print(f"\n{len(scored)} validation examples (never seen in training):", file=out)
            for row in scored:
                mark = "ok " if row["prediction"] == row["target"] else "ERR"
                print(f"  [{mark}] input      {text(row['input'])}", file=out)
                show = (lambda ids: str(ids)) if row.get("labels") else text
                print(f"        prediction {show(row['prediction'])}", file=out)
                print(f"        target     {show(row['target'])}", file=out)
            if free:
                # Free text has no single right continuation: shown, not scored.
                print(
                    f"\n{len(free)} greedy continuations of validation text "
                    "(never seen in training; newlines shown as \\n):",
                    file=out,
                )
            for row in free:
                print(f"  prompt       {text(row['input'])}", file=out)
                print(f"  model        {text(row['prediction'])}", file=out)
                print(f"  actual text  {text(row['target'])}", file=out)
        for callback in trainer.checkpoint_callbacks:
            if isinstance(callback, ModelCheckpoint):
                if callback.best_model_path:
                    print(f"best checkpoint: {callback.best_model_path}", file=out)
                if callback.last_model_path:
                    print(f"last checkpoint: {callback.last_model_path}", file=out)
        out.flush()


class RunCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose ``last.ckpt`` is always the state where training stopped.

    Lightning saves ``last`` at validation ends (and once at the end of a run that never saved
    one). A run cut short by ``max_steps`` or by Ctrl-C in the middle of an epoch would otherwise
    leave a ``last`` from an earlier step, and a resumed run would silently train (and log)
    those steps again. Under ``fast_dev_run`` nothing is saved (Lightning's rule, which its own
    end-of-training save does not follow: it wrote ``./checkpoints/last.ckpt``).
    """

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.fast_dev_run:
            return
        super().on_train_end(trainer, pl_module)
        self._save_last_if_behind(trainer)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        # Ctrl-C outside StopOnInterrupt's reach (a notebook's interrupt, a second Ctrl-C). Under
        # DDP the other processes may be anywhere: a collective save could hang, so only a
        # single process saves here.
        if (
            isinstance(exception, KeyboardInterrupt)
            and trainer.world_size == 1
            and not trainer.fast_dev_run
            and not trainer.sanity_checking
        ):
            self._save_last_if_behind(trainer)
        super().on_exception(trainer, pl_module, exception)

    def _save_last_if_behind(self, trainer: L.Trainer) -> None:
        saved = getattr(self, "_last_global_step_saved", trainer.global_step)
        if self.save_last and saved != trainer.global_step:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))


class StopOnInterrupt(Callback):
    """Turn the first Ctrl-C of a ``fit`` into a clean stop after the step in progress.

    Lightning's own answer to Ctrl-C is to abandon the run where it stands. Here the first
    SIGINT only sets a flag; at the end of the current training step the callback sets
    ``trainer.should_stop``, and Lightning ends the run as if it were complete: it validates,
    :class:`RunCheckpoint` saves ``last.ckpt`` at that step, the loggers flush. A second Ctrl-C
    raises ``KeyboardInterrupt`` as usual. Active only in a single process's main thread (under
    DDP every process would have to agree on the step; there Lightning's default applies).
    """

    def __init__(self) -> None:
        self.interrupted = False
        self._previous: Any = None

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.interrupted:  # the second Ctrl-C: abort now
            self._restore()
            raise KeyboardInterrupt
        self.interrupted = True
        print(
            "\nCtrl-C: stopping after this step and saving last.ckpt; resume with "
            "--ckpt_path last (Ctrl-C again to abort)",
            file=sys.stderr,
            flush=True,
        )

    def _restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.interrupted = False
        if trainer.world_size == 1 and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if self.interrupted:
            trainer.should_stop = True

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()

    def on_exception(self, trainer: L.Trainer, *args: Any) -> None:
        self._restore()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._restore()


class ValidateOnLastStep(Callback):
    """Validate at the last step of a run that ``max_steps`` cuts between two validations.

    ``charlm_cpu.yaml`` validates every 500 steps; with ``--trainer.max_steps 200`` it would
    never validate, and its checkpoint would have no ``val_loss`` to record. Asking Lightning to
    stop (``trainer.should_stop``) at the last step makes it validate before it stops.
    """

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if 0 < trainer.max_steps <= trainer.global_step:
            trainer.should_stop = True


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write each checkpoint to a temporary file beside it, then rename it into place.

    Lightning's default writer stages a checkpoint in a temporary file under ``$TMPDIR`` and
    copies it over; a save killed half-way leaves that file behind (often hundreds of MB), and
    its name says nothing about where it came from. Here the temporary file
    (``.last.ckpt.<random>.tmp``) sits in the checkpoint folder, is renamed with ``os.replace``
    (atomic on one file system: a reader or a killed process sees the old or the new checkpoint,
    never a partial one) and is removed on any failure, Ctrl-C included; only SIGKILL can leave
    it, beside its target. Like Lightning, no ``fsync``: a power cut may still lose the last
    save. Remote paths (``s3://``) keep Lightning's writer.
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None
    ) -> None:
        if "://" in str(path) or storage_options is not None:
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                torch.save(checkpoint, handle)
            os.replace(tmp_name, target)
        finally:
            Path(tmp_name).unlink(missing_ok=True)
