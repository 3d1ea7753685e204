"""Checkpoints of the kit's runs: what they record, how they are found, checked and loaded.

Every checkpoint a kit module writes carries, beside Lightning's own state, an entry under
``CHECKPOINT_KEY`` that says what it is: the module's class path, the model config (a plain
dict), a description of the DataModule it was trained on (task, special ids, sizes, the
tokenizer's state: :func:`describe_datamodule`) and the kit's version. From that entry

* :func:`check_checkpoint_matches` refuses a checkpoint of another module, config, task or
  dataset before any weight is loaded (a reverse checkpoint fits a copy model tensor for tensor);
* :func:`load_checkpoint_file` reads a ``.ckpt`` and turns every failure into one readable error;
* :func:`find_checkpoint` resolves ``--ckpt_path last|best`` to a file of the newest run version;
* :func:`load_module` rebuilds the LightningModule alone (``transformer-lab generate``).

The modules (:mod:`.modules`) write the entry and check it on load; the CLIs (:mod:`.cli`,
:mod:`.generate_cli`) resolve, read and check files through this module. Every refusal is a
:class:`CheckpointMismatchError` whose message names the differing values; no file is ever
modified.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = [
    "CHECKPOINT_KEY",
    "DATA_IDENTITY",
    "CheckpointMismatchError",
    "check_checkpoint_matches",
    "checkpoint_record",
    "describe_datamodule",
    "find_checkpoint",
    "load_checkpoint_file",
    "load_module",
]

CHECKPOINT_KEY = "transformer_lab"


class CheckpointMismatchError(ValueError):
    """A checkpoint that does not belong to the model it is loaded into (or cannot be read)."""


def _class_path(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def checkpoint_record(module: nn.Module, config: Any, data_info: Mapping[str, Any]) -> dict:
    """The ``CHECKPOINT_KEY`` entry a module adds to each checkpoint it writes.

    Args:
        module: the LightningModule being saved.
        config: its model config as a plain dict (``hparams["config"]``), or ``None``.
        data_info: :func:`describe_datamodule` of the run's DataModule.
    """
    from transformer_lab import __version__

    return {
        "module": _class_path(module),
        "config": config,
        "data": dict(data_info),
        "version": __version__,
    }


# The DataModule's scalar attributes that identify its data, and its tokenizers.
_DATA_FIELDS = (
    "task",
    "format",
    "vocab_size",
    "src_vocab_size",
    "tgt_vocab_size",
    "num_classes",
    "pad_id",
    "bos_id",
    "eos_id",
)
_TOKENIZER_FIELDS = ("tokenizer", "src_tokenizer", "tgt_tokenizer")


def describe_datamodule(datamodule: Any) -> dict[str, Any]:
    """Collect what decoding needs from a DataModule: ids, sizes and the tokenizer's state.

    Args:
        datamodule: the DataModule of the run (or ``None``).

    Returns:
        A JSON-friendly dict with the DataModule's class path, its special ids and sizes, and
        ``"tokenizer"``: the tokenizer's ``to_dict()`` form (with its class path) where one exists.
    """
    if datamodule is None:
        return {}
    info: dict[str, Any] = {"datamodule": _class_path(datamodule)}
    for name in (*_DATA_FIELDS, "max_len", "block_size"):
        value = getattr(datamodule, name, None)
        if isinstance(value, int | float | str | bool):
            info[name] = value
    for name in _TOKENIZER_FIELDS:
        try:
            tokenizer = getattr(datamodule, name, None)
        except ImportError:  # a lazily imported tokenizer module that is not available
            tokenizer = None
        to_dict = getattr(tokenizer, "to_dict", None)
        if callable(to_dict):
            info[name] = {
                "class": f"{type(tokenizer).__module__}.{type(tokenizer).__qualname__}",
                "state": to_dict(),
            }
    vocabulary = getattr(datamodule, "vocabulary", None) or getattr(datamodule, "itos", None)
    if isinstance(vocabulary, list | tuple) and all(isinstance(s, str) for s in vocabulary):
        info["vocabulary"] = list(vocabulary)
    return info


# What identifies a run's data: another task, format or vocabulary makes the weights mean
# something else even where every tensor shape fits (copy and reverse share all of them).
DATA_IDENTITY = ("datamodule", *_DATA_FIELDS, *_TOKENIZER_FIELDS, "vocabulary")


def _data_differences(theirs: Mapping[str, Any], ours: Mapping[str, Any]) -> list[str]:
    """``"key: checkpoint A vs run B"`` for each identity field of the data that differs."""
    out = []
    for key in DATA_IDENTITY:
        a, b = theirs.get(key), ours.get(key)
        if a is None or b is None or a == b:  # a field one side does not record is not compared
            continue
        if isinstance(a, Mapping) or isinstance(b, Mapping) or isinstance(a, list):
            out.append(f"{key}: the vocabularies differ")
        else:
            out.append(f"{key}: checkpoint {a!r} vs run {b!r}")
    return out


def check_checkpoint_matches(
    checkpoint: Mapping[str, Any], module: nn.Module, datamodule: Any = None
) -> None:
    """Refuse a checkpoint of another kind of module, model configuration, task or dataset.

    Args:
        checkpoint: the loaded checkpoint dict.
        module: the module about to receive its weights.
        datamodule: the run's DataModule, if any: its task, format and vocabulary must be the
            checkpoint's (a reverse checkpoint fits a copy model tensor for tensor, but its
            weights solve another task).

    Raises:
        CheckpointMismatchError: naming the differing module class, config fields or data.
    """
    ours = checkpoint.get(CHECKPOINT_KEY)
    if not isinstance(ours, Mapping):
        raise CheckpointMismatchError(
            "the checkpoint was not written by a transformer_lab module (no "
            f"{CHECKPOINT_KEY!r} entry); keys found: {sorted(checkpoint)[:8]}"
        )
    expected = _class_path(module)
    if ours.get("module") != expected:
        raise CheckpointMismatchError(
            f"the checkpoint holds a {ours.get('module')}, but this run builds a {expected}: "
            "pass the config the checkpoint was trained with"
        )
    theirs_cfg = ours.get("config") or {}
    our_cfg = module.hparams.get("config") or {}
    differing = {
        key: (theirs_cfg.get(key), our_cfg.get(key))
        for key in sorted(set(theirs_cfg) | set(our_cfg))
        if theirs_cfg.get(key) != our_cfg.get(key)
    }
    if differing:
        details = ", ".join(
            f"{key}: checkpoint {a!r} vs run {b!r}" for key, (a, b) in differing.items()
        )
        raise CheckpointMismatchError(
            f"the checkpoint's model config differs from this run's ({details}): "
            "it belongs to another config"
        )
    theirs_data = ours.get("data") or {}
    if datamodule is None or not theirs_data:
        return
    data_diff = _data_differences(theirs_data, describe_datamodule(datamodule))
    if data_diff:
        raise CheckpointMismatchError(
            f"the checkpoint was trained on other data ({', '.join(data_diff)}): "
            "pass the config the checkpoint was trained with"
        )


def load_checkpoint_file(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint onto the CPU, turning every failure into one readable error.

    Args:
        path: the ``.ckpt`` file.

    Returns:
        The checkpoint dict.

    Raises:
        CheckpointMismatchError: if the file is missing, unreadable, or not a transformer_lab
            checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointMismatchError(f"checkpoint {path} does not exist")
    try:
        # weights_only=False: Lightning checkpoints hold optimizer and callback state. Only load
        # checkpoints you wrote yourself.
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # torch raises many types for a damaged file
        raise CheckpointMismatchError(
            f"checkpoint {path} cannot be read (corrupt, truncated or not a checkpoint): "
            f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        ) from None
    if not isinstance(checkpoint, dict) or CHECKPOINT_KEY not in checkpoint:
        raise CheckpointMismatchError(
            f"checkpoint {path} was not written by transformer-lab (no {CHECKPOINT_KEY!r} entry)"
        )
    return checkpoint


def find_checkpoint(alias: str, run_root: str | Path) -> Path:
    """Resolve ``"last"`` or ``"best"`` to a file of the newest version of a run.

    Args:
        alias: ``"last"`` or ``"best"``.
        run_root: the run's directory, ``runs/<name>``, holding ``version_<n>/checkpoints/``.

    Returns:
        The newest ``last.ckpt`` (``"last"``) or the best checkpoint recorded in it (``"best"``).

    Raises:
        CheckpointMismatchError: if the run has no checkpoint yet.
        ValueError: for another alias.
    """
    if alias not in ("last", "best"):
        raise ValueError(f"alias={alias!r} must be 'last' or 'best'")
    run_root = Path(run_root)
    candidates = sorted(
        run_root.glob("version_*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime
    )
    if not candidates:
        raise CheckpointMismatchError(
            f"--ckpt_path {alias}: no {run_root}/version_*/checkpoints/last.ckpt yet; "
            "train first (or pass a checkpoint file)"
        )
    last = candidates[-1]
    if alias == "last":
        return last
    state = load_checkpoint_file(last).get("callbacks", {})
    for key, value in state.items():
        # Keys are the callback's class name and options, e.g. "RunCheckpoint{'monitor': ...}".
        if "Checkpoint" in str(key) and isinstance(value, dict) and value.get("best_model_path"):
            best = Path(value["best_model_path"])
            if best.is_file():
                return best
    raise CheckpointMismatchError(f"--ckpt_path best: {last} records no best checkpoint on disk")


def _import(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def load_module(checkpoint: dict[str, Any]) -> nn.Module:
    """Rebuild the LightningModule stored in ``checkpoint`` (weights loaded, in eval mode).

    Args:
        checkpoint: a checkpoint dict loaded with ``torch.load``.

    Returns:
        The module, on the CPU.

    Raises:
        CheckpointMismatchError: if the checkpoint lacks the model description or its weights do
            not fit the model it describes.
    """
    info = checkpoint.get(CHECKPOINT_KEY) or {}
    if not info.get("module") or not info.get("config"):
        raise CheckpointMismatchError(
            "the checkpoint does not describe its model (no module class or config): was it "
            "trained from a model instance? Rebuild that model and load the state dict instead"
        )
    cls = _import(info["module"])
    hparams = checkpoint.get("hyper_parameters") or {}
    # Only the constructor's own arguments: LightningCLI adds bookkeeping keys (_class_path).
    module = cls(config=info["config"], optim=hparams.get("optim"))
    try:
        module.load_state_dict(checkpoint["state_dict"])
    except (RuntimeError, KeyError) as error:
        raise CheckpointMismatchError(
            f"the checkpoint's weights do not fit its model: {str(error).splitlines()[0]}"
        ) from None
    return module.eval()
