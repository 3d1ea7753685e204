"""``transformer-lab fit|validate|test|predict``: Lightning's ``LightningCLI`` over the kit.

A run is described by a YAML file in ``configs/`` naming a LightningModule (``model``), a
DataModule (``data``) and Trainer options; every option can be overridden on the command line
(``--trainer.max_steps 500``, ``--trainer.devices 2 --trainer.strategy ddp``,
``--model.optim.lr 1e-3``). What this module adds to Lightning's CLI:

* **Linked sizes.** ``vocab_size``, the special ids and lengths are read from the instantiated
  DataModule and written into the model config (``link_arguments(..., apply_on="instantiate")``),
  so a YAML file never repeats them. A link whose source or target does not exist for the chosen
  pair (a GPT has no ``pad_id``) is skipped.
* **Precision.** ``--trainer.precision`` defaults to the device's best choice
  (:func:`~transformer_lab.training.devices.choose_precision`); giving it overrides that.
* **Checkpoints.** A ``ModelCheckpoint`` (:class:`~.callbacks.RunCheckpoint`) keeps the best
  epoch (by the ``checkpoint.monitor`` metric) and ``last.ckpt`` under
  ``runs/<name>/version_<n>/checkpoints/``. ``--ckpt_path last`` (or ``best``) resumes from the
  newest such file of the same run name, in a new version directory; checkpoints of another
  model or config, and unreadable files, are refused with one line.
* **Loggers.** By default ``runs/<name>/version_<n>/`` gets a ``CSVLogger`` (``metrics.csv``, read
  by :func:`transformer_lab.figures.plots.plot_loss_curves`) and, when the ``tensorboard``
  package is installed, a ``TensorBoardLogger`` in the same directory
  (``tensorboard --logdir runs``).
  ``--run.logger csv`` keeps only the CSV file; an explicit ``--trainer.logger`` replaces both.
  ``<name>`` is ``--run.name``, by default the config file's stem (``reverse``).
* **Examples.** At the end of ``fit``, a few validation examples are printed (``--examples.*``).
* **Runs that lose nothing.** Everything is written under ``--run.save_dir`` (checked in one
  line before any work), checkpoints atomically; the first Ctrl-C stops after the current step
  and saves it; a run cut short by ``max_steps`` validates at its last step (see
  :mod:`.callbacks`).
* **The device.** Lightning's messages a student cannot act on are hidden and TF32 is used on
  CUDA, as in the notebooks' :func:`~transformer_lab.training.trainers.make_trainer`.

Reference: https://lightning.ai/docs/pytorch/stable/cli/lightning_cli.html
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger
from lightning.pytorch.plugins.io import CheckpointIO

from transformer_lab.training.callbacks import (
    AtomicCheckpointIO,
    RunCheckpoint,
    ShowExamples,
    StopOnInterrupt,
    ValidateOnLastStep,
)
from transformer_lab.training.checkpoints import (
    CheckpointMismatchError,
    check_checkpoint_matches,
    find_checkpoint,
    load_checkpoint_file,
)
from transformer_lab.training.devices import choose_precision
from transformer_lab.training.trainers import quiet_lightning, use_tensor_cores

__all__ = [
    "DATA_LINKS",
    "TransformerLabCLI",
    "find_checkpoint",
    "load_checkpoint_file",
    "make_cli",
    "run_lightning_cli",
]

RUNS_DIR = "runs"

# (DataModule attribute, model config field): applied where both exist.
DATA_LINKS: tuple[tuple[str, str], ...] = (
    ("vocab_size", "vocab_size"),
    ("src_vocab_size", "src_vocab_size"),
    ("tgt_vocab_size", "tgt_vocab_size"),
    ("num_classes", "num_classes"),
    ("pad_id", "pad_id"),
    ("bos_id", "bos_id"),
    ("eos_id", "eos_id"),
    ("max_len", "max_len"),
    ("block_size", "n_ctx"),
)


def _default_loggers(save_dir: str, name: str, kind: str) -> list[Logger]:
    csv = CSVLogger(save_dir=save_dir, name=name)
    loggers: list[Logger] = [csv]
    has_tensorboard = any(
        importlib.util.find_spec(package) is not None for package in ("tensorboard", "tensorboardX")
    )
    if kind == "tensorboard" and not has_tensorboard:
        raise ValueError("--run.logger tensorboard needs the tensorboard package: pip install it")
    if kind == "tensorboard" or (kind == "auto" and has_tensorboard):
        # Same directory as the CSV files: one folder per run version.
        loggers.append(
            TensorBoardLogger(save_dir=save_dir, name=name, version=csv.version, sub_dir=None)
        )
    return loggers


class ConfigError(ValueError):
    """A value in the run's configuration was refused while building the model, data or trainer."""


def check_writable_dir(path: str | Path, option: str) -> Path:
    """Make sure ``path`` is a folder this process can write in, or can create; create nothing.

    Args:
        path: the folder (it may not exist yet: its nearest existing parent is checked).
        option: the option that named it, for the message (``"--run.save_dir"``).

    Returns:
        ``path`` as a ``Path``.

    Raises:
        ConfigError: in one line naming the path and why (a file in the way, no permission,
            a read-only file system).
    """
    folder = Path(path).expanduser()
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        why = f"{existing} is a file, not a folder"
    elif existing == folder:
        try:  # the one reliable test (permissions, ACLs, read-only mounts): write a file
            with tempfile.TemporaryFile(dir=folder):
                pass
            return folder
        except OSError as error:
            why = error.strerror or type(error).__name__
    elif os.access(existing, os.W_OK | os.X_OK):
        return folder
    else:
        why = f"no permission to create folders in {existing}"
    raise ConfigError(f"{option} {path}: cannot write there ({why})")


def _as_list(value: Any) -> list[Any]:
    """A Trainer option that takes one object or a list of them (or None), as a list."""
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def _user_error(error: BaseException) -> BaseException | None:
    """The deepest ``ValueError`` in ``error``'s chain of causes.

    jsonargparse wraps the kit's own error (``d_model=10 is not divisible by n_heads=4``) in
    errors of its own ("Does not validate against any of the Union subtypes"); the root cause is
    the one that names the bad value.
    """
    seen: set[int] = set()
    found: BaseException | None = None
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ValueError):
            found = current
        current = current.__cause__ or current.__context__
    return found


class TransformerLabCLI(LightningCLI):
    """``LightningCLI`` with linked data sizes, automatic precision, checkpoints and examples."""

    def instantiate_classes(self) -> None:
        """Build model, data and trainer; a refused value becomes one clear :class:`ConfigError`.

        Without this, a bad value (``--model.init_args.config.d_model 10`` with four heads) would
        surface as jsonargparse's nested traceback instead of the kit's own message.
        """
        try:
            super().instantiate_classes()
        except Exception as error:
            cause = _user_error(error)
            if cause is None:
                raise
            raise ConfigError(str(cause).strip().splitlines()[0]) from error

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        for source, target in DATA_LINKS:
            parser.link_arguments(
                f"data.{source}", f"model.init_args.config.{target}", apply_on="instantiate"
            )
        parser.add_argument(
            "--run.name",
            type=str | None,
            default=None,
            help="run name: logs and checkpoints go to runs/<name>/ (default: config file stem)",
        )
        parser.add_argument(
            "--run.logger",
            type=Literal["auto", "csv", "tensorboard"],
            default="auto",
            help="auto: CSV, plus TensorBoard when installed; csv: CSV only; tensorboard: both",
        )
        parser.add_argument("--run.save_dir", type=str, default=RUNS_DIR, help="root of all runs")
        parser.add_argument(
            "--run.num_threads",
            type=int | None,
            default=None,
            help="CPU threads for torch (default: torch's choice); 1 suits tiny models best",
        )
        parser.add_lightning_class_args(RunCheckpoint, "checkpoint")
        parser.set_defaults(
            {
                "checkpoint.monitor": "val_loss",
                "checkpoint.mode": "min",
                "checkpoint.save_last": True,
                "checkpoint.save_top_k": 1,
                "checkpoint.filename": "best-{epoch}-{step}",
                "trainer.precision": choose_precision(),
            }
        )
        parser.add_lightning_class_args(ShowExamples, "examples")

    # -- run name and loggers ---------------------------------------------------------------------

    def _section(self, config: Any) -> Any:
        return config[self.subcommand] if self.subcommand else config

    def _run_name(self) -> str:
        section = self._section(self.config)
        name = section.get("run", {}).get("name") if hasattr(section, "get") else None
        if name:
            return str(name)
        configs = section.get("config") or []
        if configs:
            return Path(str(configs[-1])).stem
        return type(self.model).__name__.removesuffix("Module").lower() or "run"

    def before_instantiate_classes(self) -> None:
        """Refuse an unusable ``--run.save_dir`` in one line, before anything is built or run."""
        run = self._section(self.config).get("run") or {}
        check_writable_dir(str(run.get("save_dir") or RUNS_DIR), "--run.save_dir")

    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        quiet_lightning()
        section = self._section(self.config_init)
        trainer_config = section["trainer"]
        run = section.get("run") or {}
        save_dir = str(run.get("save_dir") or RUNS_DIR)
        threads = run.get("num_threads")
        if threads is not None:
            if threads < 1:
                raise ValueError(f"run.num_threads={threads} must be >= 1")
            torch.set_num_threads(threads)
        if trainer_config.get("logger") in (True, None) and "logger" not in kwargs:
            # Lightning's default logger (TensorBoard, or CSV in lightning_logs/) is replaced
            # by ours under runs/<name>/; `--trainer.logger false` still disables logging.
            kwargs["logger"] = _default_loggers(
                save_dir, self._run_name(), run.get("logger", "auto")
            )
        if trainer_config.get("default_root_dir") is None and "default_root_dir" not in kwargs:
            # Where Lightning writes when no logger gives it a folder (`--trainer.logger false`):
            # under --run.save_dir too, never the current directory.
            kwargs["default_root_dir"] = str(Path(save_dir) / self._run_name())
        plugins = _as_list(trainer_config.get("plugins"))
        if not any(isinstance(plugin, CheckpointIO) for plugin in plugins):
            kwargs["plugins"] = [*plugins, AtomicCheckpointIO()]  # unless the user chose one
        callbacks = _as_list(trainer_config.get("callbacks"))
        kwargs["callbacks"] = [*callbacks, StopOnInterrupt(), ValidateOnLastStep()]
        trainer = super().instantiate_trainer(**kwargs)
        use_tensor_cores(trainer)
        return trainer

    # -- checkpoint resolution and validation -------------------------------------------------

    def _prepare_checkpoint(self) -> None:
        section = self._section(self.config_init)
        ckpt_path = section.get("ckpt_path")
        if ckpt_path is None:
            return
        if ckpt_path in ("last", "best"):
            logger = self.trainer.loggers[0] if self.trainer.loggers else None
            if logger is None or logger.save_dir is None:
                return  # no run directory to search: leave it to Lightning
            resolved = find_checkpoint(ckpt_path, Path(logger.save_dir) / str(logger.name))
            print(f"--ckpt_path {ckpt_path}: {resolved}", file=sys.stderr)
            section["ckpt_path"] = ckpt_path = str(resolved)
        checkpoint = load_checkpoint_file(ckpt_path)
        check_checkpoint_matches(checkpoint, self.model, self.datamodule)

    def _parse_ckpt_path(self) -> None:
        # Lightning >= 2.5 reads a checkpoint file given on the command line before anything is
        # built and silently replaces the model's arguments with the checkpoint's. Here the run's
        # config stays authoritative: an unreadable file is refused now, and a checkpoint of
        # another config is refused in before_<subcommand> instead of being adopted.
        subcommand = self.config.get("subcommand") if hasattr(self.config, "get") else None
        if not subcommand:
            return
        ckpt_path = self.config[subcommand].get("ckpt_path")
        if ckpt_path and ckpt_path not in ("last", "best", "hpc", "registry"):
            load_checkpoint_file(ckpt_path)

    def before_fit(self) -> None:
        self._prepare_checkpoint()

    def before_validate(self) -> None:
        self._prepare_checkpoint()

    def before_test(self) -> None:
        self._prepare_checkpoint()

    def before_predict(self) -> None:
        self._prepare_checkpoint()


def make_cli(args: list[str] | None, **kwargs: Any) -> TransformerLabCLI:
    """Build (and, unless ``run=False``, run) the kit's ``LightningCLI`` on ``args``.

    Args:
        args: command-line words, e.g. ``["fit", "--config", "configs/reverse.yaml"]``;
            ``None`` reads ``sys.argv``.
        **kwargs: overrides of ``LightningCLI``'s constructor arguments, e.g. ``run=False`` or
            ``trainer_defaults={"callbacks": [...]}``.

    Returns:
        The CLI object (``.trainer``, ``.model``, ``.datamodule``).
    """
    options: dict[str, Any] = {
        "subclass_mode_model": True,
        "subclass_mode_data": True,
        "seed_everything_default": 0,
        "save_config_kwargs": {"overwrite": True},
        "parser_kwargs": {"default_env": False},
        # Lightning warns when given args equal to the process's own argv: pass None then.
        "args": None if args is None or list(args) == sys.argv[1:] else args,
    }
    options.update(kwargs)
    return TransformerLabCLI(L.LightningModule, L.LightningDataModule, **options)


def run_lightning_cli(args: list[str] | None = None) -> int:
    """Run ``transformer-lab fit|validate|test|predict`` with ``args`` (the words after the
    program name).

    Args:
        args: command-line words, e.g. ``["fit", "--config", "configs/reverse.yaml"]``;
            ``None`` reads ``sys.argv``.

    Returns:
        The process exit status: 0 on success, 2 for a refused checkpoint or configuration
        value, 130 for a run stopped by Ctrl-C (saved; ``--ckpt_path last`` resumes it), or the
        code of the argument parser's exit (``--help`` gives 0, a bad option 2).
    """
    try:
        cli = make_cli(args)
    except (CheckpointMismatchError, ConfigError) as error:
        print(f"transformer-lab: error: {error}", file=sys.stderr)
        return 2
    except SystemExit as exit_:
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    trainer = getattr(cli, "trainer", None)
    callbacks = getattr(trainer, "callbacks", None) or []
    if any(isinstance(c, StopOnInterrupt) and c.interrupted for c in callbacks):
        return 130  # the shell's code for "stopped by Ctrl-C", so `fit && next` does not go on
    return 0
