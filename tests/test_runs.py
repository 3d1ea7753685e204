"""Runs that never lose work and write only where they are told.

Where a run writes (``--run.save_dir``, never the current directory), Ctrl-C in the middle of an
epoch (``last.ckpt`` holds that step; resuming trains and logs no step twice), an unusable save
folder (one line, before any work), checkpoints of another task (refused), checkpoint files
(written beside their target, nothing left in ``$TMPDIR``), the end of a short char-LM run, and
data-parallel training on two CPU processes.
"""

from __future__ import annotations

import csv
import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
QUIET = [
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--examples.num_examples=0",
]


def _reverse(save_dir: Path, *extra: str, config: str = "reverse") -> list[str]:
    """A short run of a synthetic task: 10 batches of 64 per epoch, 64 validation examples."""
    return [
        "fit",
        "--config",
        str(CONFIGS / f"{config}.yaml"),
        "--run.save_dir",
        str(save_dir),
        "--run.logger=csv",
        "--data.init_args.num_train=640",
        "--data.init_args.num_val=64",
        *QUIET,
        *extra,
    ]


def _logged_steps(run_root: Path) -> Counter:
    """How often each training step's loss was logged, over every version of a run."""
    steps: Counter = Counter()
    for metrics in run_root.glob("version_*/metrics.csv"):
        with metrics.open() as handle:
            for row in csv.DictReader(handle):
                if row.get("train_loss"):
                    steps[int(row["step"])] += 1
    return steps


# -- where a run writes ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [["--trainer.fast_dev_run=true"], ["--trainer.logger=false", "--trainer.max_steps=2"]],
    ids=["fast_dev_run", "no-logger"],
)
def test_fit_writes_only_under_its_save_dir(
    extra: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fast_dev_run used to leave ./checkpoints/last.ckpt in the current directory."""
    from transformer_lab.training.cli import make_cli

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    make_cli(_reverse(tmp_path / "runs", *extra))
    assert list(cwd.iterdir()) == []
    if "--trainer.logger=false" in extra:  # no logger folder: checkpoints under save_dir/<name>
        assert (tmp_path / "runs" / "reverse" / "checkpoints" / "last.ckpt").is_file()


def test_a_refused_config_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --run.save_dir a run writes runs/ in the current directory, but only once it
    starts: a refused value must not leave an empty runs/ there."""
    from transformer_lab.training.cli import run_lightning_cli

    monkeypatch.chdir(tmp_path)
    args = ["fit", "--config", str(CONFIGS / "reverse.yaml"), "--model.init_args.config.n_heads=3"]
    assert run_lightning_cli(args) == 2
    assert list(tmp_path.iterdir()) == []


def test_unusable_save_dir_is_refused_in_one_line_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformer_lab.training.cli import run_lightning_cli

    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert run_lightning_cli(_reverse(blocker / "runs")) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert err == [
        f"transformer-lab: error: --run.save_dir {blocker / 'runs'}: cannot write there "
        f"({blocker} is a file, not a folder)"
    ]
    assert "Trainer" not in captured.out + captured.err  # nothing was built


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root may write anywhere")
def test_read_only_save_dir_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformer_lab.training.cli import run_lightning_cli

    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert run_lightning_cli(_reverse(locked / "runs")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(locked / "runs") in err[0]


# -- Ctrl-C ------------------------------------------------------------------------------------


class _SendSigint(Callback):
    """Deliver SIGINT to this process, as Ctrl-C in a terminal does, when a step begins."""

    def __init__(self, at_step: int) -> None:
        self.at_step = at_step

    def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == self.at_step:
            os.kill(os.getpid(), signal.SIGINT)


class _RaiseInterrupt(Callback):
    """Raise KeyboardInterrupt after a step, as a notebook's interrupt button does."""

    def __init__(self, at_step: int) -> None:
        self.at_step = at_step

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == self.at_step:
            raise KeyboardInterrupt


class _RecordStart(Callback):
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.global_step = trainer.global_step


@pytest.fixture
def restore_sigint():
    """Lightning ignores SIGINT after it has handled a KeyboardInterrupt: put it back."""
    previous = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("how", ["sigint", "keyboard_interrupt"])
def test_ctrl_c_mid_epoch_saves_that_step_and_resume_logs_no_step_twice(
    how: str, tmp_path: Path, restore_sigint: None
) -> None:
    """Interrupted in epoch 2 (10 steps per epoch): last.ckpt holds the interrupted step.

    Before the fix last.ckpt held step 10 (the end of epoch 1) while the log reached step 13, so
    the resumed run trained steps 10-13 again and logged them a second time.
    """
    from transformer_lab.training.cli import make_cli

    root = tmp_path / "runs"
    steps = ["--trainer.max_steps=20", "--trainer.max_epochs=-1", "--trainer.log_every_n_steps=1"]
    if how == "sigint":
        # The first Ctrl-C finishes the step in progress (step 13 -> 14) and ends the run.
        cli = make_cli(_reverse(root, *steps), trainer_defaults={"callbacks": [_SendSigint(13)]})
        assert cli.trainer.global_step == 14
        stopped = 14
    else:
        # A KeyboardInterrupt raised after step 13: Lightning shuts down and exits.
        with pytest.raises(SystemExit):
            make_cli(_reverse(root, *steps), trainer_defaults={"callbacks": [_RaiseInterrupt(13)]})
        stopped = 13
    last = root / "reverse" / "version_0" / "checkpoints" / "last.ckpt"
    saved = torch.load(last, map_location="cpu", weights_only=False)
    assert saved["global_step"] == stopped
    assert max(_logged_steps(root / "reverse")) < stopped

    recorder = _RecordStart()
    cli = make_cli(
        _reverse(root, *steps, "--ckpt_path", "last"), trainer_defaults={"callbacks": [recorder]}
    )
    assert recorder.global_step == stopped
    assert cli.trainer.global_step == 20
    logged = _logged_steps(root / "reverse")
    assert [step for step, count in logged.items() if count > 1] == []
    assert set(range(stopped, 20)) <= set(logged)


def test_a_run_stopped_by_ctrl_c_exits_with_130(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_sigint: None
) -> None:
    """Saved, but not finished: ``transformer-lab fit ... && next`` must not go on."""
    import transformer_lab.training.cli as cli_module

    make_cli = cli_module.make_cli
    monkeypatch.setattr(
        cli_module,
        "make_cli",
        lambda args: make_cli(args, trainer_defaults={"callbacks": [_SendSigint(3)]}),
    )
    steps = ["--trainer.max_steps=8", "--trainer.max_epochs=-1"]
    assert cli_module.run_lightning_cli(_reverse(tmp_path / "runs", *steps)) == 130
    monkeypatch.undo()
    assert cli_module.run_lightning_cli(_reverse(tmp_path / "runs", *steps)) == 0


def test_the_second_ctrl_c_aborts(tmp_path: Path, restore_sigint: None) -> None:
    from transformer_lab.training.callbacks import StopOnInterrupt

    stop = StopOnInterrupt()
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False)
    stop.on_train_start(trainer, None)
    try:
        os.kill(os.getpid(), signal.SIGINT)  # first: a flag only
        assert stop.interrupted
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        stop.teardown(trainer, None, "fit")
    assert signal.getsignal(signal.SIGINT) is not stop._handler


# -- checkpoints of another task, and how they are written --------------------------------------


def test_checkpoint_of_another_task_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """copy and reverse share every tensor shape: only the data tells their weights apart."""
    from transformer_lab.training.cli import run_lightning_cli

    assert run_lightning_cli(_reverse(tmp_path / "runs", "--trainer.max_steps=2")) == 0
    last = tmp_path / "runs" / "reverse" / "version_0" / "checkpoints" / "last.ckpt"
    capsys.readouterr()
    args = _reverse(tmp_path / "runs", "--trainer.max_steps=4", "--ckpt_path", str(last))
    assert run_lightning_cli([*args[:2], str(CONFIGS / "copy.yaml"), *args[3:]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "task: checkpoint 'reverse' vs run 'copy'" in err[0]
    assert not (tmp_path / "runs" / "copy").exists() or not list(
        (tmp_path / "runs" / "copy").glob("version_*/checkpoints/*.ckpt")
    )


def test_trainer_fit_with_a_checkpoint_of_another_task_is_refused(tmp_path: Path) -> None:
    """The same check when a notebook calls Trainer.fit(..., ckpt_path=...) directly."""
    from transformer_lab.data import SyntheticDataModule
    from transformer_lab.models import EncoderConfig
    from transformer_lab.training.modules import CheckpointMismatchError, ClassifierModule

    def parts(task: str) -> tuple[ClassifierModule, SyntheticDataModule]:
        data = SyntheticDataModule(task=task, num_train=128, num_val=32, batch_size=32)
        cfg = EncoderConfig(vocab_size=data.vocab_size, max_len=data.max_len, d_model=16)
        return ClassifierModule(cfg), data

    kwargs = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False}
    trainer = L.Trainer(max_steps=1, default_root_dir=tmp_path, **kwargs)
    trainer.fit(*parts("reverse"))
    trainer.save_checkpoint(tmp_path / "reverse.ckpt")
    module, data = parts("copy")
    trainer = L.Trainer(max_steps=2, enable_checkpointing=False, **kwargs)
    with pytest.raises(CheckpointMismatchError, match="task: checkpoint 'reverse' vs run 'copy'"):
        trainer.fit(module, data, ckpt_path=tmp_path / "reverse.ckpt")


def test_the_cli_writes_checkpoints_with_the_atomic_writer(tmp_path: Path) -> None:
    from transformer_lab.training.callbacks import AtomicCheckpointIO
    from transformer_lab.training.cli import make_cli

    cli = make_cli(_reverse(tmp_path / "runs", "--trainer.max_steps=1"))
    assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)


def test_a_failed_save_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    from transformer_lab.training.callbacks import AtomicCheckpointIO

    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))
    target = tmp_path / "ckpts" / "last.ckpt"
    writer = AtomicCheckpointIO()
    writer.save_checkpoint({"step": 1}, target)
    assert torch.load(target, weights_only=False) == {"step": 1}

    def interrupted(obj: object, handle) -> None:
        handle.write(b"half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        writer.save_checkpoint({"step": 2}, target)
    monkeypatch.undo()
    assert sorted(p.name for p in target.parent.iterdir()) == ["last.ckpt"]
    assert torch.load(target, weights_only=False) == {"step": 1}  # the old one, whole
    assert list(tmpdir.iterdir()) == []


def test_a_killed_save_leaves_nothing_in_tmpdir(tmp_path: Path) -> None:
    """SIGKILL in the middle of a save: no cleanup can run, so where the file lies matters."""
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    target = tmp_path / "ckpts" / "last.ckpt"
    script = textwrap.dedent(
        f"""
        import os, signal, torch
        from transformer_lab.training.callbacks import AtomicCheckpointIO

        def killed(obj, handle):
            handle.write(b"half a checkpoint")
            handle.flush()
            os.kill(os.getpid(), signal.SIGKILL)

        torch.save = killed
        AtomicCheckpointIO().save_checkpoint({{"step": 1}}, {str(target)!r})
        """
    )
    env = {**os.environ, "TMPDIR": str(tmpdir), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script], env=env, timeout=120, check=False)
    assert done.returncode == -signal.SIGKILL
    assert list(tmpdir.iterdir()) == []
    leftovers = [p.name for p in target.parent.iterdir()]
    assert len(leftovers) == 1 and leftovers[0].startswith(".last.ckpt.")  # beside its target
    assert not target.exists()


# -- the end of a short char-LM run --------------------------------------------------------------


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/tinyshakespeare.txt"  # nothing listens there any more


def test_short_charlm_run_validates_and_shows_free_text_on_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """charlm_cpu validates every 500 steps; a 20-step run must still validate once (at its end),
    its closing examples must not grade free text, and each example must stay on its line."""
    import warnings

    from transformer_lab.data import CorpusFallbackWarning
    from transformer_lab.training.cli import make_cli

    args = [
        "fit",
        "--config",
        str(CONFIGS / "charlm_cpu.yaml"),
        "--run.save_dir",
        str(tmp_path / "runs"),
        "--run.logger=csv",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.max_steps=20",
        "--data.init_args.val_blocks=24",
        "--examples.num_examples=2",
        # Offline on purpose: the grammar corpus stands in (its sentences span several lines).
        f"--data.init_args.url={_closed_port_url()}",
        f"--data.init_args.cache_dir={tmp_path / 'cache'}",
        "--data.init_args.timeout=2",
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli = make_cli(args)
    assert "val_loss" in cli.trainer.callback_metrics
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "could not find the monitored key" in m]
    (fallback,) = [w for w in caught if issubclass(w.category, CorpusFallbackWarning)]
    assert Path(fallback.filename).as_posix().endswith("transformer_lab/data/datamodules.py")
    best = list((tmp_path / "runs" / "charlm_cpu").glob("version_0/checkpoints/best-*.ckpt"))
    assert len(best) == 1 and "step=20" in best[0].name

    out = capsys.readouterr().out
    assert "[ERR]" not in out and "[ok ]" not in out
    start = out.index("greedy continuations")
    lines = out[start:].splitlines()[1:7]
    labels = ["  prompt ", "  model ", "  actual text "] * 2
    assert [line[: len(label)] for line, label in zip(lines, labels, strict=True)] == labels


# -- two processes ------------------------------------------------------------------------------


def test_ddp_on_two_cpu_processes(tmp_path: Path) -> None:
    """``--trainer.devices 2 --trainer.strategy ddp``: two processes (gloo), one run folder."""
    args = _reverse(
        tmp_path / "runs",
        "--trainer.accelerator=cpu",
        "--trainer.devices=2",
        "--trainer.strategy=ddp",
        "--trainer.max_steps=4",
        "--trainer.max_epochs=-1",
        "--trainer.log_every_n_steps=1",
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, "-m", "transformer_lab.cli", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "distributed_backend=gloo" in done.stderr + done.stdout
    versions = list((tmp_path / "runs" / "reverse").glob("version_*"))
    assert [v.name for v in versions] == ["version_0"]
    last = versions[0] / "checkpoints" / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 4
    assert sorted(_logged_steps(tmp_path / "runs" / "reverse")) == [0, 1, 2, 3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
