"""Carrying the student's answers forward, and the PyTorch stand-ins for the missing ones.

In-process: the stand-ins agree with the kit's own answers (masks, empty rows, dropout off);
answers are saved as source and loaded again; the table names real checks; the folder rule; the
build version orders as pip orders it. In a student package with every lab locked (a
subprocess): saved answers are installed and said so, a wrong one is named, and the package's
own ``fit`` ends with status 2 and one line naming the lab it lacks.
"""

from __future__ import annotations

import linecache
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from packaging.version import Version

from transformer_lab import answers, attention, blocks, masks, standins
from transformer_lab.grading.course import list_labs
from transformer_lab.grading.student import build_package_tree, build_version

REPO = Path(__file__).resolve().parents[1]


def test_every_answer_names_a_visible_check_and_a_kit_object() -> None:
    for answer in answers.ANSWERS:
        assert callable(answer.check_function()), answer
        if answer.kit is not None:
            assert answers.kit_object(answer.kit) is not None, answer.kit
    assert set(standins.STAND_INS) <= {a.kit for a in answers.ANSWERS}


def test_stand_in_attention_and_masks_agree_with_the_kit() -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, t, 4, generator=gen) for t in (5, 6, 6))
    mask = torch.rand(2, 1, 5, 6, generator=gen) > 0.4
    mask[0, 0, 1] = False  # a query that may attend nothing
    stand_in = standins.STAND_INS["transformer_lab.attention.scaled_dot_product_attention"]
    for got, want in zip(
        stand_in(q, k, v, mask), attention.scaled_dot_product_attention(q, k, v, mask), strict=True
    ):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(
        standins.STAND_INS["transformer_lab.masks.causal_mask"](6), masks.causal_mask(6)
    )
    padding = torch.tensor([[True] * 4, [True, True, False, False]])  # (B, T)
    combine = standins.STAND_INS["transformer_lab.masks.combine_masks"]
    for args in ((padding, masks.causal_mask(4)), (None, masks.causal_mask(4)), (padding, None)):
        assert torch.equal(combine(*args), masks.combine_masks(*args))
    x = torch.randn(2, 5, 8, generator=gen)
    torch.testing.assert_close(
        standins.STAND_INS["transformer_lab.blocks.layer_norm"](x, None, None),
        blocks.layer_norm(x, None, None),
        atol=1e-5,
        rtol=1e-5,
    )


def test_stand_in_multi_head_attention_is_the_kits_with_the_same_weights() -> None:
    torch.manual_seed(0)
    ours = attention.MultiHeadAttention(8, 2).eval()
    theirs = standins.StandInMultiHeadAttention(8, 2).eval()
    theirs.load_state_dict(ours.state_dict())  # the same parameter names
    query, memory = torch.randn(2, 5, 8), torch.randn(2, 6, 8)
    mask = torch.rand(2, 1, 5, 6) > 0.4
    mask[1, :, 2] = False  # a query no head may attend
    with torch.no_grad():
        for got, want in zip(
            theirs(query, memory, memory, mask), ours(query, memory, memory, mask), strict=True
        ):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        got, _ = theirs(query, query, query, is_causal=True, need_weights=False)
        want, _ = ours(query, query, query, is_causal=True, need_weights=False)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="d_model=10"):
        standins.StandInMultiHeadAttention(10, 4)


def test_a_kit_attention_with_its_own_projection_runs_on_the_stand_in() -> None:
    """The GPT's attention (one fused ``qkv_proj``, its own ``project``) on the stand-in base, as
    in a locked package: the kit's output with the same weights."""
    from transformer_lab.models import CausalSelfAttention

    class Fused(standins.StandInMultiHeadAttention):
        def __init__(self, d_model: int, n_heads: int) -> None:
            super().__init__(d_model, n_heads)
            del self.q_proj, self.k_proj, self.v_proj
            self.qkv_proj = torch.nn.Linear(d_model, 3 * d_model)

        project = CausalSelfAttention.project

    torch.manual_seed(0)
    kit = CausalSelfAttention(8, 2).eval()
    ours = Fused(8, 2).eval()
    ours.load_state_dict(kit.state_dict())
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        for options in ({"is_causal": True, "need_weights": False}, {"mask": masks.causal_mask(5)}):
            got, want = ours(x, x, x, **options), kit(x, x, x, **options)
            torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
            assert (got[1] is None) == (want[1] is None)


def test_stand_in_encoder_block_is_a_torch_encoder_layer_with_the_kits_interface() -> None:
    block = standins.StandInEncoderBlock(8, 2, 16, norm_first=True).eval()
    kit = blocks.EncoderBlock(8, 2, 16, norm_first=True)
    assert sum(p.numel() for p in block.parameters()) == sum(p.numel() for p in kit.parameters())
    x = torch.randn(2, 5, 8)
    padding = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])  # (B, S)
    with torch.no_grad():
        out = block(x, padding[:, None, None, :])
    assert out.shape == (2, 5, 8) and torch.isfinite(out).all()


def _define(source: str, name: str) -> object:
    """Define ``name`` from ``source`` as a notebook cell would (its source findable)."""
    filename = f"<cell-{name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict = {"torch": torch}
    exec(compile(source, filename, "exec"), namespace)
    return namespace[name]


def test_save_writes_source_that_runs_and_keeps_earlier_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(answers.ANSWERS_ENV, str(tmp_path / "mine"))
    monkeypatch.delenv(answers.GRADER_ENV, raising=False)
    one = _define("def softmax(x, dim=-1):\n    return torch.softmax(x, dim)\n", "softmax")
    two = _define(
        "@torch.no_grad()\ndef self_attention_matrix(x):\n    return x\n", "self_attention_matrix"
    )
    lab = "02_self_attention"
    path = answers.save(lab, "softmax", one, {"torch": torch})
    assert path == tmp_path / "mine" / "lab02.py"
    answers.save(lab, "self_attention_matrix", two, {"torch": torch})
    text = path.read_text()
    assert "import torch" in text and "@torch.no_grad()" in text and "def softmax" in text
    loaded = answers.load_saved(lab)
    assert sorted(loaded) == ["self_attention_matrix", "softmax"]
    assert torch.allclose(loaded["softmax"](torch.zeros(3)), torch.full((3,), 1 / 3))
    assert answers.save(lab, "not_an_answer", one, {}) is None
    monkeypatch.setenv(answers.GRADER_ENV, "1")  # the grader's kernel: nothing saved or loaded
    assert answers.save(lab, "softmax", one, {}) is None and answers.load_saved(lab) == {}


def test_answers_folder_beside_the_lab_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(answers.ANSWERS_ENV, raising=False)
    monkeypatch.setattr(answers, "DRIVE", tmp_path / "no-drive")
    lab = tmp_path / "course" / "03_multi_head_attention"
    lab.mkdir(parents=True)
    assert answers.answers_folder(lab) == tmp_path / "course" / "my_answers"
    assert answers.answers_folder(tmp_path) == tmp_path / "my_answers"
    monkeypatch.setattr(answers, "DRIVE", tmp_path)  # Colab with Drive mounted
    assert answers.answers_folder(lab) == tmp_path / "my_answers"


def test_each_build_has_a_newer_version_than_the_last() -> None:
    import datetime as dt

    first = build_version("0.1.0", dt.datetime(2026, 10, 2, 9, 0, tzinfo=dt.timezone.utc))
    later = build_version("0.1.0", dt.datetime(2026, 10, 9, 17, 30, tzinfo=dt.timezone.utc))
    assert first == "0.1.0.post20261002090000"
    assert Version("0.1.0") < Version(first) < Version(later)


# --------------------------------------------------------------------------------------
# In a student package with every lab locked
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def locked_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("locked")
    build_package_tree(REPO, out, list_labs(REPO))
    return out


def _run(tree: Path, code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env={
            "PYTHONPATH": str(tree),
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "OMP_NUM_THREADS": "1",
            "MPLBACKEND": "Agg",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=300,
    )


_LAB02_OK = """import math

import torch


def softmax(x, dim=-1):
    e = (x - x.amax(dim, keepdim=True)).exp()
    return e / e.sum(dim, keepdim=True)


def self_attention_matrix(X, W_q, b_q, W_k, b_k, W_v, b_v):
    Q, K, V = X @ W_q + b_q, X @ W_k + b_k, X @ W_v + b_v  # (N, d_k), (N, d_k), (N, d_v)
    return softmax(Q @ K.T / math.sqrt(W_q.shape[1]), dim=-1) @ V  # (N, d_v)


def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = softmax(scores, dim=-1)  # (..., T, S)
    if mask is not None:
        weights = weights * mask
    return weights @ v, weights
"""
_SOFTMAX_WRONG = "def softmax(x, dim=-1):\n    return x.exp()\n"


def test_saved_answers_fill_the_locked_kit_and_a_wrong_one_is_named(
    locked_tree: Path, tmp_path: Path
) -> None:
    """Lab 02's answers, each calling the student's own softmax (carried into the kit's
    ``attention.softmax``), pass their checks: one line lists them; lab 01, not taken, gets one
    line; a wrong saved softmax, or a file that does not run, one line for lab 02."""
    mine = tmp_path / "my_answers"
    mine.mkdir()
    (mine / "lab02.py").write_text(_LAB02_OK)
    code = """
        import torch
        from transformer_lab import answers, attention
        for line in answers.summary(answers.install(before="03_multi_head_attention")):
            print(line)
        print(attention.softmax(torch.zeros(4)).tolist())
        q, kv = torch.ones(1, 2, 4), torch.ones(1, 3, 4)
        out, w = attention.scaled_dot_product_attention(q, kv, kv)
        print(tuple(w.shape))
    """
    done = _run(locked_tree, code, tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == (
        "Your saved answers: softmax, self_attention_matrix, scaled_dot_product_attention (02)."
    ), done.stdout
    assert lines[1].startswith("Lab 01 (01_positional_encoding): no saved answers"), lines
    assert "stand-ins for sinusoidal_encoding" in lines[1] and "not sinusoids" in lines[1]
    assert "nothing stands in for relative_shift_matrix" in lines[1]  # no stand-in either
    assert lines[2:] == ["[0.25, 0.25, 0.25, 0.25]", "(1, 2, 3)"], lines
    (mine / "lab02.py").write_text(_SOFTMAX_WRONG)
    done = _run(locked_tree, code, tmp_path)
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stdout.splitlines() if "Lab 02" in line]
    assert len(said) == 1 and "your saved softmax fails the visible check" in said[0], said
    assert "no saved self_attention_matrix, scaled_dot_product_attention" in said[0], said
    (mine / "lab02.py").write_text("def softmax(:\n")
    done = _run(locked_tree, code, tmp_path)
    said = [line for line in done.stdout.splitlines() if "Lab 02" in line]
    assert len(said) == 1 and "your saved answers are not used: lab02.py does not run" in said[0]


@pytest.mark.slow
def test_fit_in_a_locked_package_trains_on_stand_ins_or_exits_2_naming_the_lab(
    locked_tree: Path, tmp_path: Path
) -> None:
    """An encoder and a GPT train on PyTorch stand-ins (lab 04's training pieces included); an
    encoder-decoder needs lab 06's decoder block, which nothing stands in for."""
    for config, status in (
        ("reverse.yaml", 0),
        ("charlm_cpu.yaml", 0),
        ("grammar_translation.yaml", 2),
    ):
        code = f"""
            import sys
            from transformer_lab.cli import main
            config = "{REPO / "configs" / config}"
            sys.exit(main(["fit", "--config", config, "--trainer.max_steps", "5",
                           "--run.save_dir", "{tmp_path / "runs"}"]))
        """
        done = _run(locked_tree, code, tmp_path, TRANSFORMER_LAB_PROFILE="grading")
        assert done.returncode == status, (config, done.stderr[-2000:])
        assert "Traceback" not in done.stderr and "Union" not in done.stderr
        said = [ln for ln in done.stderr.splitlines() if ln.startswith("transformer-lab")]
        assert said[0].startswith("transformer-lab fit runs on PyTorch stand-ins for labs 01-05")
        if status == 2:
            assert len(said) == 2 and "the answer to lab 06_decoder_training" in said[1], (
                done.stderr[-2000:]
            )


@pytest.mark.slow
def test_generate_in_a_locked_package_exits_2_with_one_line_naming_the_lab(
    locked_tree: Path, tmp_path: Path
) -> None:
    from test_cli import _fit_two_steps

    checkpoint = _fit_two_steps("reverse", tmp_path / "runs")  # trained with the whole kit
    code = f"""
        import sys
        from transformer_lab.cli import main
        sys.exit(main(["generate", "--ckpt_path", "{checkpoint}", "--prompt", "1 2 3"]))
    """
    done = _run(locked_tree, code, tmp_path, TRANSFORMER_LAB_PROFILE="grading")
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 2 and "the answer to lab 0" in lines[1], done.stderr[-2000:]
    assert lines[0].startswith("transformer-lab generate finds no saved answers in "), lines


def test_a_stamped_wheel_carries_its_version_in_metadata_and_package(tmp_path: Path) -> None:
    import zipfile

    from transformer_lab.grading.student import build_student_wheel

    wheel = build_student_wheel(REPO, tmp_path, ["08_language_models"], version="0.1.0.post1").wheel
    assert wheel.name == "transformer_lab-0.1.0.post1-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        init = zf.read("transformer_lab/__init__.py").decode()
        meta = zf.read("transformer_lab-0.1.0.post1.dist-info/METADATA").decode()
    assert '__version__ = "0.1.0.post1"' in init and "Version: 0.1.0.post1" in meta


def test_the_setup_cell_reads_latest_json_and_upgrades_an_older_kit() -> None:
    from transformer_lab.grading.standard import setup_cell_source

    cell = setup_cell_source("03_multi_head_attention", "https://course.example/kit/")
    assert 'kit_site + "/latest.json"' in cell
    assert 'latest["version"] != have' in cell and "Updating the transformer-lab kit from" in cell
    compile(cell, "setup", "exec")


def test_a_saved_answer_is_fitted_to_the_kits_wider_interface() -> None:
    class Narrow(torch.nn.Module):  # a lab-03 answer: no dropout, need_weights, is_causal, cache
        def __init__(self, d_model: int, n_heads: int, bias: bool = True) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(d_model, d_model, bias=bias)

        def forward(self, query, key, value, mask=None):
            self.seen = mask
            return self.proj(query), None

    fitted = answers._fit_interface(Narrow, "MultiHeadAttention", "03_multi_head_attention")
    layer = fitted(8, 2, bias=False, dropout=0.1)  # the kit passes dropout
    x = torch.randn(1, 3, 8)
    out, _ = layer(x, x, x, need_weights=False, is_causal=True)
    assert out.shape == (1, 3, 8) and torch.equal(layer.seen, masks.causal_mask(3))
    with pytest.raises(NotImplementedError, match="lab 03_multi_head_attention"):
        layer(x, x, x, kv_cache=object())
    narrow = answers._fit_interface(
        lambda padding, causal: padding[:, None, None, :] & causal, "combine_masks", "05_masking"
    )
    padding = torch.tensor([[True] * 4, [True, True, False, False]])
    for args in ((padding, masks.causal_mask(4)), (None, masks.causal_mask(4)), (padding, None)):
        assert torch.equal(narrow(*args), masks.combine_masks(*args))


def test_an_idle_stand_in_is_refused_inside_a_check() -> None:
    from transformer_lab.checks import lab03

    def wraps_the_stand_in(x: torch.Tensor, n_heads: int) -> torch.Tensor:
        from transformer_lab import standins as s  # imported inside the call

        return s.STAND_INS["transformer_lab.attention.split_heads"](x, n_heads)

    with pytest.raises(AssertionError, match="does not allow"):
        lab03.check_split_heads(wraps_the_stand_in)


# --------------------------------------------------------------------------------------
# Lab 04's training pieces, which every kit LightningModule calls (lab 08 trains one)
# --------------------------------------------------------------------------------------

_KIT_PIECES = {
    name: f"transformer_lab.training.{module}.{name}"
    for module, name in (
        ("modules", "token_cross_entropy"),
        ("modules", "log_metrics"),
        ("schedule", "build_optimizer"),
    )
}


def test_lab04_training_pieces_have_stand_ins_that_are_never_saved() -> None:
    for name, dotted in _KIT_PIECES.items():
        (answer,) = [a for a in answers.ANSWERS if a.kit == dotted]
        assert answer.lab == "04_transformer_block" and not answer.asked, answer
        assert dotted in standins.STAND_INS
        assert name not in answers._by_name("04_transformer_block")  # never saved nor loaded


def test_stand_in_loss_is_the_kits_over_the_positions_not_ignored() -> None:
    from transformer_lab.training.modules import token_cross_entropy

    gen = torch.Generator().manual_seed(0)
    loss = standins.STAND_INS[_KIT_PIECES["token_cross_entropy"]]
    logits = torch.randn(2, 5, 7, generator=gen, dtype=torch.float64)
    targets = torch.randint(0, 7, (2, 5), generator=gen)
    targets[1, 3:] = -100  # padding
    got = loss(logits, targets)
    assert got.dtype == torch.float32 and got.shape == ()
    torch.testing.assert_close(got, token_cross_entropy(logits, targets), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(
        loss(logits[0], targets[0]), token_cross_entropy(logits[0], targets[0])
    )


def test_stand_in_optimizer_follows_the_kits_schedule_with_torchs_schedulers() -> None:
    from torch.optim.lr_scheduler import SequentialLR

    from transformer_lab.training import OptimConfig
    from transformer_lab.training.schedule import warmup_cosine_lambda

    build = standins.STAND_INS[_KIT_PIECES["build_optimizer"]]
    model = torch.nn.Linear(3, 2)
    optim = OptimConfig(lr=0.1, weight_decay=0.05, warmup_steps=4, total_steps=20, min_lr_ratio=0.1)
    out = build(model, optim)
    optimizer, schedule = out["optimizer"], out["lr_scheduler"]
    assert isinstance(optimizer, torch.optim.AdamW) and isinstance(
        schedule["scheduler"], SequentialLR
    )
    assert schedule["interval"] == "step" and schedule["frequency"] == 1
    kit = warmup_cosine_lambda(4, 20, 0.1)
    rates = []
    for _ in range(20):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule["scheduler"].step()
    assert rates == pytest.approx([0.1 * kit(step) for step in range(20)], rel=1e-6)
    short = build(model, OptimConfig(lr=0.1, warmup_steps=100), estimated_steps=3)  # fast_dev_run
    assert short["optimizer"].param_groups[0]["lr"] > 0
    with pytest.raises(ValueError, match="estimated_steps=inf"):
        build(model, OptimConfig(), estimated_steps=float("inf"))


def test_stand_in_logging_logs_the_stage_loss_and_its_metrics() -> None:
    from torchmetrics import MeanMetric, MetricCollection

    logged: list[tuple[str, dict]] = []

    class Module:
        def log(self, name: str, value: object, **options: object) -> None:
            logged.append((name, options))

    log = standins.STAND_INS[_KIT_PIECES["log_metrics"]]
    log(Module(), "train", torch.tensor(1.0), 4)
    log(
        Module(),
        "val",
        torch.tensor(2.0),
        4,
        MetricCollection({"ppl": MeanMetric()}, prefix="val_"),
    )
    assert [name for name, _ in logged] == ["train_loss", "val_loss", "val_ppl"]
    assert logged[0][1]["on_step"] and not logged[0][1]["on_epoch"]
    assert all(o["on_epoch"] and o["prog_bar"] and o["batch_size"] == 4 for _, o in logged[1:])


_RUN_LAB08 = """
    import json, nbformat
    from transformer_lab import lab  # noqa: F401  (the setup cell imports it too)
    nb = nbformat.read({notebook!r}, as_version=4)
    shown, failed = [], {{}}
    space = {{"display": lambda obj, *a, **k: shown.append(type(obj).__name__)}}
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {{}}).get("grade_id", "")
        if cell.cell_type != "code" or "### BEGIN HIDDEN TESTS" in cell.source:
            continue  # a student's release holds no hidden checks
        source = cell.source.replace("https://YOUR-COURSE-SITE/kit/", "http://127.0.0.1:9/kit/")
        try:
            exec(compile(source, gid or "cell", "exec"), space)
        except Exception as exc:
            failed[gid] = f"{{type(exc).__name__}}: {{exc}}"
    print("RESULT " + json.dumps({{"failed": failed, "shown": shown, "trained": space["TRAINED"]}}))
"""


def test_lab08_demos_run_with_every_lab_locked_and_nothing_saved(
    locked_tree: Path, tmp_path: Path
) -> None:
    """The training demo runs on PyTorch stand-ins for lab 04's pieces; a demo that samples
    (lab 07's answers, which nothing stands in for) says so in one line; nothing cascades."""
    import json

    notebook = REPO / "solutions" / "08_language_models" / "08_language_models.ipynb"
    done = _run(
        locked_tree,
        _RUN_LAB08.format(notebook=str(notebook)),
        tmp_path,
        TRANSFORMER_LAB_PROFILE="grading",
        TRANSFORMER_LAB_ANSWERS=str(tmp_path / "my_answers"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
    # Only lab 08's own visible check of seeded sampling needs lab 07's answers: no demo fails.
    assert set(result["failed"]) <= {"test_generate_sampling"}, result["failed"]
    assert result["trained"] and "Figure" in result["shown"]
    out = done.stdout
    assert (
        "Lab 04 (04_transformer_block): no saved answers (lab not taken yet); the demos use "
        "PyTorch stand-ins for layer_norm, FeedForward, EncoderBlock." in out
    ), out
    assert re.search(r"120 steps in \d+ s: validation loss [\d.]+ nats per character", out), out
    skipped = [line for line in out.splitlines() if line.startswith("Skipped ")]
    assert skipped and all("the answer to lab 07_nlp_pipeline" in line for line in skipped)
    assert "Skipped the sampled texts: needs apply_temperature" in out


def test_a_ban_knows_the_kits_code_by_identity_not_by_the_slot_it_sits_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The student's softmax carried into ``transformer_lab.attention.softmax`` is theirs: an
    answer calling it passes lab 02's check; the kit's own softmax stays refused under any alias."""
    from transformer_lab.checks import lab02
    from transformer_lab.judge.bans import ForbiddenCallError

    kits_softmax = attention.softmax
    mine = _define(
        "def softmax(x, dim=-1):\n"
        "    e = (x - x.amax(dim, keepdim=True)).exp()\n"
        "    return e / e.sum(dim, keepdim=True)\n",
        "softmax",
    )
    monkeypatch.setattr(attention, "softmax", mine)  # what answers.install does with a saved one

    def through_the_slot(X, W_q, b_q, W_k, b_k, W_v, b_v):
        q, k, v = (X @ w + (0 if b is None else b) for w, b in ((W_q, b_q), (W_k, b_k), (W_v, b_v)))
        return attention.softmax(q @ k.T / k.shape[-1] ** 0.5, dim=-1) @ v  # (N, Dv)

    def through_an_alias(X, W_q, b_q, W_k, b_k, W_v, b_v, softmax=kits_softmax):
        q, k, v = (X @ w + (0 if b is None else b) for w, b in ((W_q, b_q), (W_k, b_k), (W_v, b_v)))
        return softmax(q @ k.T / k.shape[-1] ** 0.5, dim=-1) @ v  # (N, Dv)

    lab02.check_self_attention_matrix(through_the_slot)
    with pytest.raises(ForbiddenCallError, match=r"transformer_lab\.attention\.softmax"):
        lab02.check_self_attention_matrix(through_an_alias)


# --------------------------------------------------------------------------------------
# What a saved answer needs, read from the student's cells
# --------------------------------------------------------------------------------------


def _kernel(*cells: str) -> dict:
    """A namespace after running ``cells`` as IPython does (``In`` and :mod:`linecache`)."""
    namespace: dict = {"In": [""]}
    for number, source in enumerate(cells, 1):
        filename = f"/tmp/ipykernel_0/cell{number}-{abs(hash(source))}.py"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        namespace["In"].append(source)
        exec(compile(source, filename, "exec"), namespace)
    return namespace


_SETUP = """\
import collections
import itertools
import math
import re

import lightning as L
import torch

session = type("Session", (), {"device": torch.device("cpu")})()  # the notebook's, not an answer's
device = session.device
"""


@pytest.mark.parametrize(
    ("cell", "carried"),
    [
        ("SCALE = 1.0\n\n\ndef softmax(x, dim=-1):\n    e = (x * SCALE).exp()\n"
         "    return e / e.sum(dim, keepdim=True)\n", "SCALE = 1.0"),
        ("def _exps(x):\n    return x.exp()\n\n\ndef softmax(x, dim=-1):\n    e = _exps(x)\n"
         "    return e / e.sum(dim, keepdim=True)\n", "def _exps(x):"),
        ("def softmax(x, dim=-1):\n    assert issubclass(L.LightningModule, torch.nn.Module)\n"
         "    e = x.exp()\n    return e / e.sum(dim, keepdim=True)\n", "import lightning as L"),
        ("def softmax(x, dim=-1):\n    e = x.exp() * math.exp(0)\n"
         "    return e / e.sum(dim, keepdim=True)\n", "import math"),
        ("def softmax(x, dim=-1):\n    e = x.exp()\n"
         "    return e / sum(itertools.repeat(e.sum(dim, keepdim=True), 1))\n", "import itertools"),
        ("def softmax(x, dim=-1):\n    assert collections.Counter('aa')['a'] == 2\n"
         "    e = x.exp()\n    return e / e.sum(dim, keepdim=True)\n", "import collections"),
        ('NUMBER = re.compile(r"\\d+")\n\n\ndef softmax(x, dim=-1):\n'
         '    assert NUMBER.fullmatch("12")\n    e = x.exp()\n'
         "    return e / e.sum(dim, keepdim=True)\n", "NUMBER = re.compile"),
        ("def softmax(x, dim=-1, depth=1):\n    if depth:\n"
         "        return softmax(x, dim, depth - 1)\n    e = x.exp()\n"
         "    return e / e.sum(dim, keepdim=True)\n", "return softmax(x, dim, depth - 1)"),
    ],
    ids=["constant", "helper", "lightning", "math", "itertools", "collections", "re",
         "recursive"],
)  # fmt: skip
def test_an_answer_carries_its_imports_constants_and_helpers(
    cell: str, carried: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setenv(answers.ANSWERS_ENV, str(tmp_path))
    monkeypatch.delenv(answers.GRADER_ENV, raising=False)
    namespace = _kernel(_SETUP, cell)
    path = answers.save("02_self_attention", "softmax", namespace["softmax"], namespace)
    assert path is not None and capsys.readouterr().out == ""  # nothing to warn about
    text = path.read_text()
    assert carried in text and "session" not in text, text
    loaded = answers.load_saved("02_self_attention")["softmax"]
    assert torch.allclose(loaded(torch.zeros(4)), torch.full((4,), 0.25))


def test_a_name_the_saved_file_cannot_define_is_said_when_saving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setenv(answers.ANSWERS_ENV, str(tmp_path))
    monkeypatch.delenv(answers.GRADER_ENV, raising=False)
    cell = "def softmax(x, dim=-1):\n    e = x.to(device).exp()\n    return e / e.sum(dim)\n"
    namespace = _kernel(_SETUP, cell)
    path = answers.save("02_self_attention", "softmax", namespace["softmax"], namespace)
    said = capsys.readouterr().out.strip().splitlines()
    assert path is not None and len(said) == 1, said
    assert said[0].startswith("Warning: your softmax was saved to ") and "device" in said[0]
    assert "device = session.device" in said[0] and "later labs cannot use it" in said[0]


def test_answers_of_one_lab_keep_what_each_needs_and_a_later_one_calls_the_saved_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setenv(answers.ANSWERS_ENV, str(tmp_path))
    monkeypatch.delenv(answers.GRADER_ENV, raising=False)
    lab = "07_nlp_pipeline"
    train = 'END_OF_WORD = "</w>"\n\n\ndef bpe_train(words, merges):\n    return [END_OF_WORD]\n'
    first = _kernel(_SETUP, train)
    answers.save(lab, "bpe_train", first["bpe_train"], first)
    encode = "def bpe_encode(word, merges):\n    return list(word) + [END_OF_WORD]\n"
    later = _kernel("import torch\n", encode)  # another session: END_OF_WORD is in the file
    later["END_OF_WORD"] = "</w>"
    path = answers.save(lab, "bpe_encode", later["bpe_encode"], later)
    assert capsys.readouterr().out == ""
    loaded = answers.load_saved(lab)
    assert loaded["bpe_train"]([], []) == ["</w>"]
    assert loaded["bpe_encode"]("ab", []) == ["a", "b", "</w>"]
    assert path.read_text().count('END_OF_WORD = "</w>"') == 1
