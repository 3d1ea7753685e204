"""The notebooks' trainer (``make_trainer``): device and precision, TF32 on CUDA, no noise; the
checks' quiet logs (``lightning_logs_off``)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from transformer_lab.training import trainers

REPO = Path(__file__).resolve().parents[1]

# A short fit, with Lightning's worker advice forced as on a 16-core GPU host (a 2-core CPU
# gets none): `kit` builds the trainer with make_trainer, `plain` with lightning.Trainer.
FIT = textwrap.dedent(
    """
    import sys
    import lightning as L
    import lightning.pytorch.trainer.connectors.data_connector as data_connector
    data_connector.suggested_max_num_workers = lambda *args, **kwargs: 15
    from transformer_lab.data import SyntheticDataModule
    from transformer_lab.models import EncoderConfig
    from transformer_lab.training import ClassifierModule, make_trainer

    dm = SyntheticDataModule(task="reverse", num_train=128, num_val=32, batch_size=32)
    cfg = EncoderConfig(vocab_size=dm.vocab_size, max_len=dm.max_len, d_model=16, n_heads=2)
    kwargs = dict(max_steps=2, logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1)
    trainer = make_trainer(**kwargs) if sys.argv[1] == "kit" else L.Trainer(**kwargs)
    trainer.fit(ClassifierModule(cfg), datamodule=dm)
    """
)
NOISE = {
    "cloud-logger tip": "litlogger",
    "LeafSpec deprecation": "LeafSpec",
    "DataLoader workers advice": "num_workers",
}


def _fit_output(kind: str, tmp_path: Path) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": ""}
    done = subprocess.run(
        [sys.executable, "-c", FIT, kind],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


def test_make_trainer_fit_prints_none_of_lightnings_noise(tmp_path: Path) -> None:
    plain = _fit_output("plain", tmp_path)
    # The test can fail: a plain Trainer prints all three here.
    assert [name for name, text in NOISE.items() if text not in plain] == []
    kit = _fit_output("kit", tmp_path)
    assert [name for name, text in NOISE.items() if text in kit] == [], kit
    assert "transformer-lab: training on cpu" in kit and "in 32-true precision" in kit
    assert "Trainer.fit` stopped" in kit  # Lightning's own useful lines stay


def test_make_trainer_picks_the_devices_precision_and_given_arguments_win(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from transformer_lab.training import AtomicCheckpointIO, make_trainer

    trainer = make_trainer(max_steps=1, logger=False)
    assert trainer.precision == "32-true"  # a CPU
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    assert "training on cpu" in capsys.readouterr().out
    trainer = make_trainer(precision="bf16-mixed", accelerator="cpu", logger=False, verbose=False)
    assert trainer.precision == "bf16-mixed"
    assert capsys.readouterr().out == ""


def test_tensor_cores_are_used_on_cuda_only() -> None:
    from lightning.pytorch.accelerators import CPUAccelerator, CUDAAccelerator

    from transformer_lab.training import use_tensor_cores

    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert not use_tensor_cores(SimpleNamespace(accelerator=CPUAccelerator()))
        assert torch.get_float32_matmul_precision() == "highest"
        assert use_tensor_cores(SimpleNamespace(accelerator=CUDAAccelerator()))
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)


def test_the_cli_sets_up_its_trainer_the_same_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformer_lab.training.cli as cli_module

    seen: list[object] = []
    monkeypatch.setattr(cli_module, "use_tensor_cores", seen.append)
    args = [
        "fit",
        "--config",
        str(REPO / "configs" / "reverse.yaml"),
        "--run.save_dir",
        str(tmp_path),
        "--trainer.fast_dev_run=true",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
    ]
    cli = cli_module.make_cli(args)
    assert seen == [cli.trainer]


PROGRESS = textwrap.dedent(
    """
    import lightning as L
    from lightning.pytorch.callbacks import TQDMProgressBar
    from tqdm.std import tqdm as text_tqdm
    from transformer_lab import lab
    from transformer_lab.data import SyntheticDataModule
    from transformer_lab.models import EncoderConfig
    from transformer_lab.training import ClassifierModule

    lab._one_line_progress()  # what lab.setup does in a notebook that imported lightning
    dm = SyntheticDataModule(task="reverse", num_train=256, num_val=64, batch_size=32)
    cfg = EncoderConfig(vocab_size=dm.vocab_size, max_len=dm.max_len, d_model=16, n_heads=2)
    trainer = L.Trainer(max_steps=24, logger=False, enable_checkpointing=False,
                        enable_model_summary=False, val_check_interval=8, num_sanity_val_steps=2,
                        check_val_every_n_epoch=None)  # a plain Trainer, as lab 06's students write
    (bar,) = [c for c in trainer.callbacks if isinstance(c, TQDMProgressBar)]
    trainer.fit(ClassifierModule(cfg), datamodule=dm)
    print("BAR", type(bar).__name__, isinstance(bar.train_progress_bar, text_tqdm))
    """
)


def test_in_a_notebook_lightnings_progress_is_one_text_line(tmp_path: Path) -> None:
    """Rich is installed here (and on Colab), ipywidgets too: the bar is still tqdm's text bar,
    every redraw on one line (carriage returns), and validation adds no bar of its own."""
    done = subprocess.run(
        [sys.executable, "-c", PROGRESS],
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        timeout=300,
    )
    out = done.stdout.decode()  # bytes: text mode would turn each "\r" into a line break
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert "BAR TQDMProgressBar True" in out
    bar_lines = [line for line in out.split("\n") if "Epoch" in line]
    assert len(bar_lines) == 1, bar_lines  # redraws are "\r"-separated states of one line
    assert bar_lines[0].rsplit("\r", 1)[-1].startswith("Epoch 2: 100%")
    assert "Validation" not in out and "Sanity" not in out


def test_a_check_running_a_trainer_quiets_lightnings_loggers_only() -> None:
    """Lightning's device lines and tips are hidden while a check runs a Trainer; a student's
    own warnings are not (no process-wide logging.disable), and Lightning's level comes back."""
    before = logging.getLogger("lightning.pytorch").level
    with trainers.lightning_logs_off():
        assert not logging.getLogger("lightning.pytorch.utilities.rank_zero").isEnabledFor(
            logging.WARNING
        )
        assert logging.getLogger("my_notebook").isEnabledFor(logging.WARNING)
    assert logging.getLogger("lightning.pytorch").level == before
