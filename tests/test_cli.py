"""The ``transformer-lab`` command: ``info``, ``fit`` and ``generate``, end to end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer_lab.cli import main

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


def _fit_reverse(root: Path, *extra: str) -> Path:
    """Train the reverse task briefly in process; return the run's last checkpoint."""
    args = [
        "fit",
        "--config",
        str(CONFIGS / "reverse.yaml"),
        "--run.save_dir",
        str(root),
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        *extra,
    ]
    assert main(args) == 0
    last = root / "reverse" / "version_0" / "checkpoints" / "last.ckpt"
    assert last.is_file()
    return last


def _fit_two_steps(config: str, root: Path, num_examples: int = 0) -> Path:
    """Two training steps of ``configs/<config>.yaml`` on small data; return the last checkpoint."""
    args = [
        "fit",
        "--config",
        str(CONFIGS / f"{config}.yaml"),
        "--run.save_dir",
        str(root),
        "--run.logger=csv",
        "--trainer.max_steps=2",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--examples.num_examples={num_examples}",
        "--data.init_args.num_train=128",
        "--data.init_args.num_val=32",
    ]
    assert main(args) == 0
    last = root / config / "version_0" / "checkpoints" / "last.ckpt"
    assert last.is_file()
    return last


def test_info_runs_as_a_console_script() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "transformer_lab.cli", "info"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    from transformer_lab.training.devices import choose_precision

    assert f"precision        {choose_precision()}" in result.stdout
    assert f"torch            {torch.__version__}" in result.stdout


def test_fit_help_exits_cleanly(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", "--help"]) == 0
    out = capsys.readouterr().out
    for option in ("--trainer.max_steps", "--ckpt_path", "--run.name", "--checkpoint.monitor"):
        assert option in out


def test_fit_then_generate_with_an_untrained_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A few steps: files in the right places, and generate maps 16 symbols to 16 symbols."""
    last = _fit_reverse(
        tmp_path,
        "--trainer.max_steps=3",
        "--trainer.log_every_n_steps=1",
        "--data.init_args.num_train=256",
        "--run.logger=csv",
    )
    run = last.parents[1]
    assert (run / "config.yaml").is_file()
    from transformer_lab.plots import read_metrics_csv

    assert [step for step, _ in read_metrics_csv(run / "metrics.csv")["train_loss"]] == [0, 1, 2]
    capsys.readouterr()
    assert main(["generate", "--ckpt_path", str(last), "--prompt", "0123456789012345"]) == 0
    out = capsys.readouterr().out.strip()
    assert len(out) == 16 and set(out) <= set("0123456789")


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("--model.init_args.config.n_heads=3", "d_model=32 is not divisible by n_heads=3"),
        ("--data.init_args.seq_len=0", "seq_len=0"),
    ],
)
def test_fit_refuses_a_bad_value_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, message: str
) -> None:
    args = ["fit", "--config", str(CONFIGS / "reverse.yaml"), option]
    args += ["--run.save_dir", str(tmp_path), "--trainer.max_steps=1"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"transformer-lab: error: {message}" in err
    assert "jsonargparse" not in err  # none of the parser's nested traceback


def test_generate_refuses_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.ckpt"
    bad.write_text("not a checkpoint")
    assert main(["generate", "--ckpt_path", str(bad), "--prompt", "1"]) == 2
    assert "cannot be read" in capsys.readouterr().err
    missing = tmp_path / "missing.ckpt"
    assert main(["generate", "--ckpt_path", str(missing), "--prompt", "1"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["generate", "--prompt", "1"]) == 2  # --ckpt_path is required


@pytest.mark.slow
def test_main_job_reverses_unseen_sequences(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`transformer-lab fit --config configs/reverse.yaml`, then generate on fresh sequences."""
    last = _fit_reverse(tmp_path, "--run.logger=csv")
    out = capsys.readouterr().out
    assert "validation examples" in out and "[ok ]" in out  # printed by the fit-end callback
    assert "last checkpoint" in out
    from transformer_lab.plots import read_metrics_csv

    val_acc = read_metrics_csv(last.parents[1] / "metrics.csv")["val_acc"]
    assert val_acc[-1][1] >= 0.99, f"validation token accuracy {val_acc}"
    generator = torch.Generator().manual_seed(123)
    for _ in range(3):
        digits = "".join(str(int(d)) for d in torch.randint(0, 10, (16,), generator=generator))
        assert main(["generate", "--ckpt_path", str(last), "--prompt", digits]) == 0
        assert capsys.readouterr().out.strip() == digits[::-1]


@pytest.mark.parametrize(
    ("config", "prompt", "extra"),
    [
        ("grammar_lm", "the", ["--max_new_tokens", "4", "--num_samples", "2", "--top_k", "3"]),
        ("grammar_lm", "the man", ["--max_new_tokens", "3", "--beam_width", "2"]),
        ("grammar_translation", "the dogs chased the child", []),
        ("grammar_translation", "the dogs chased the child", ["--beam_width", "2"]),
    ],
)
def test_generate_decodes_lm_and_seq2seq_checkpoints(
    config: str,
    prompt: str,
    extra: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    last = _fit_two_steps(config, tmp_path)
    capsys.readouterr()
    assert main(["generate", "--ckpt_path", str(last), "--prompt", prompt, *extra]) == 0
    # An untrained decoder may stop at once: an empty line is still one output.
    lines = capsys.readouterr().out.rstrip("\n").split("\n")
    if "--num_samples" in extra:  # each sample under its own header, so they never run together
        assert lines[0::2] == ["--- sample 1 of 2 ---", "--- sample 2 of 2 ---"]
        lines = lines[1::2]
    assert len(lines) == 1 + ("--num_samples" in extra)
    if config == "grammar_lm":  # an LM continues its prompt (the BOS it was trained with is hidden)
        assert all(line.startswith(prompt) for line in lines)
    assert "<" not in " ".join(lines)  # special tokens are not printed


def test_a_locked_decoder_costs_the_examples_not_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a student package before lab 08's deadline, ``generate`` raises LockedAnswerError.

    Training an LM (lab 04's answers) still finishes and saves; the end-of-fit examples and
    ``transformer-lab generate`` say in one line why they are not there, with no traceback.
    """
    import transformer_lab.generation as generation
    from transformer_lab.graded import LockedAnswerError

    message = "generate is graded in lab 08_language_models: use your own until its deadline"

    def locked(*args: object, **kwargs: object) -> None:
        raise LockedAnswerError(message)

    monkeypatch.setattr(generation, "generate", locked)
    last = _fit_two_steps("grammar_lm", tmp_path, num_examples=2)
    assert f"no validation examples: {message}" in capsys.readouterr().out
    assert main(["generate", "--ckpt_path", str(last), "--prompt", "the"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"transformer-lab generate: not available yet: {message}"
