"""The Lightning training layer: modules, LR schedule, device choice and the CLI.

What lives here:

* :mod:`.modules`: thin ``LightningModule`` wrappers around the kit's plain ``nn.Module`` models
  (:class:`ClassifierModule`, :class:`Seq2SeqModule`, :class:`CausalLMModule`).
* :mod:`.schedule`: ``OptimConfig`` and ``build_optimizer``: AdamW with linear warm-up followed by
  cosine decay, stepped once per optimizer step.
* :mod:`.checkpoints`: what a checkpoint records, finding, checking and loading checkpoints.
* :mod:`.devices`: which accelerator and precision to use, and ``transformer-lab info``.
* :mod:`.trainers`: :func:`make_trainer` (the notebooks' ``Trainer``: device, precision, TF32,
  one line saying which), :func:`quiet_lightning` (no messages a student cannot act on), and
  for the checks :func:`lightning_logs_off` and :data:`BARE`.
* :mod:`.callbacks`: clean ends of runs (``last.ckpt`` where training stopped, Ctrl-C, a
  validation at the last step), the atomic checkpoint writer, and the end-of-fit examples.
* :mod:`.cli`: ``transformer-lab fit|validate|test|predict`` (Lightning's ``LightningCLI``).
* :mod:`.generate_cli`: ``transformer-lab generate``.

Names are imported lazily so that ``import transformer_lab.training`` (and ``transformer-lab info``)
does not pay for importing Lightning.
"""

from __future__ import annotations

from transformer_lab._lazy import lazy_exports

_EXPORTS = {
    "ClassifierModule": "modules",
    "Seq2SeqModule": "modules",
    "CausalLMModule": "modules",
    "OptimConfig": "schedule",
    "build_optimizer": "schedule",
    "token_cross_entropy": "modules",
    "log_metrics": "modules",
    "warmup_cosine_lambda": "schedule",
    "warmup_cosine_scheduler": "schedule",
    "weight_decay_groups": "schedule",
    "choose_precision": "devices",
    "choose_accelerator": "devices",
    "print_info": "devices",
    "ShowExamples": "callbacks",
    "RunCheckpoint": "callbacks",
    "StopOnInterrupt": "callbacks",
    "ValidateOnLastStep": "callbacks",
    "AtomicCheckpointIO": "callbacks",
    "BARE": "trainers",
    "lightning_logs_off": "trainers",
    "make_trainer": "trainers",
    "quiet_lightning": "trainers",
    "use_tensor_cores": "trainers",
    "CheckpointMismatchError": "checkpoints",
    "make_cli": "cli",
    "run_lightning_cli": "cli",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
