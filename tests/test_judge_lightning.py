"""The judge on Lightning modules: labs 04 and 06 judged from outside the student's kernel.

The student's ``LightningModule`` stays in the kernel; the check's small model goes into it as a
portable model (rebuilt there, so the student's loss has its graph), the judge's mirror holds the
check's own model in its place (the loss's backward reaches the check's parameters), ``self.log``
is recorded by the check through the kernel, the optimizer and scheduler that
``configure_optimizers`` returns are read as torch's classes whose parameter groups hold the
judge's parameters, and Lightning's ``Trainer`` loops run in the kernel through the checks'
harnesses, which return only data. Typical mistakes of the kit's catalogues
(``tests/test_lab04_checks.py``, ``tests/test_lab06_checks.py``) fail the same cells through the
judge as they do locally, with their own messages; correct answers pass.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import test_lab04_checks as t04
import test_lab06_checks as t06
import torch
from check_support import assert_fails, run_checks
from judge_support import InProcessKernel, answers_namespace

from transformer_lab.checks import lab04
from transformer_lab.checks._lightning import build_module, run_training_step
from transformer_lab.grading.judge import JudgeSession, judge_cell
from transformer_lab.lab import Session

HIDDEN04 = "from transformer_lab.grading.hidden import lab04 as hidden04\n"
HIDDEN06 = "from transformer_lab.grading.hidden import lab06 as hidden06\n"

TAGGING_CELLS = {
    "visible": "lab04.check_training_step(TaggingModule)",
    "hidden": HIDDEN04 + "hidden04.hidden_check_training_step(TaggingModule, seed=4401)",
}
TAGGING_OPTIMIZER_CELLS = {
    "visible": "lab04.check_configure_optimizers(TaggingModule)",
    "hidden": HIDDEN04 + "hidden04.hidden_check_configure_optimizers(TaggingModule, seed=4402)",
}
TRANSLATION_CELLS = {
    "training_step": "lab06.check_training_step(TranslationModule)",
    "validation_step": "lab06.check_validation_step(TranslationModule)",
    "configure_optimizers": "lab06.check_configure_optimizers(TranslationModule)",
    "hidden": HIDDEN06 + "hidden06.hidden_check_translation_module(TranslationModule, seed=631)",
}
TRAIN_TRANSLATOR_CELLS = {
    "visible": "lab06.check_train_translator(train_translator, session)",
    "hidden": HIDDEN06
    + "hidden06.hidden_check_train_translator(train_translator, session, seed=641)",
}


@cache
def _base(lab: str) -> dict[str, Any]:
    return answers_namespace(lab)


def judged(
    monkeypatch: pytest.MonkeyPatch, lab: str, name: str, cells: dict[str, str], **extra: Any
) -> dict[str, Callable[[Any], None]]:
    """The cells as checks of an answer bound to ``name``, each decided by the judge."""

    def check(source: str) -> Callable[[Any], None]:
        def run(answer: Any) -> None:
            namespace = {**_base(lab), **extra, name: answer}
            session = JudgeSession(InProcessKernel(monkeypatch, namespace), timeout=120)
            verdict = judge_cell("cell", source, session)
            if not verdict.passed:
                raise AssertionError(verdict.message)

        return run

    return {key: check(source) for key, source in cells.items()}


# ---------------------------------------------------------------- lab 04: TaggingModule


@pytest.mark.parametrize("cells", [TAGGING_CELLS, TAGGING_OPTIMIZER_CELLS])
def test_the_solutions_tagging_module_passes_through_the_judge(
    monkeypatch: pytest.MonkeyPatch, cells: dict[str, str]
) -> None:
    checks = judged(monkeypatch, "04_transformer_block", "TaggingModule", cells)
    answer = _base("04_transformer_block")["TaggingModule"]
    assert run_checks(checks, answer) == dict.fromkeys(cells, "")


@pytest.mark.parametrize(
    ("cells", "mistake", "words"),
    [
        (TAGGING_CELLS, "mean_over_padding", "padding included"),
        (TAGGING_CELLS, "no_mask", "without the padding mask"),
        (TAGGING_CELLS, "returns_item", "not loss.item()"),
        (TAGGING_CELLS, "returns_detached", "without its autograd graph"),
        (TAGGING_CELLS, "no_log", "logged nothing"),
        (TAGGING_CELLS, "log_item", "makes the CPU wait for the GPU"),
        (TAGGING_CELLS, "enable_graph", "keeps the step's whole autograd graph"),
        (TAGGING_CELLS, "keeps_graph", "self.history[0] holds a tensor with its autograd"),
        (TAGGING_OPTIMIZER_CELLS, "adam", "decays the weights directly"),
        (TAGGING_OPTIMIZER_CELLS, "no_decay", "has weight_decay=0"),
        (TAGGING_OPTIMIZER_CELLS, "subset", "does not update"),
        (TAGGING_OPTIMIZER_CELLS, "no_scheduler", "without a learning-rate schedule"),
        (TAGGING_OPTIMIZER_CELLS, "per_epoch", "every 1 epoch(s)"),
        (TAGGING_OPTIMIZER_CELLS, "linear_decay", "It decays linearly"),
    ],
)
def test_each_tagging_module_mistake_fails_through_the_judge_with_its_message(
    monkeypatch: pytest.MonkeyPatch, cells: dict[str, str], mistake: str, words: str
) -> None:
    checks = judged(monkeypatch, "04_transformer_block", "TaggingModule", cells)
    assert_fails(checks, t04.module_with(mistake), list(cells), words)


def test_the_checks_model_gets_the_gradients_and_the_optimizer_its_parameters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    namespace = dict(_base("04_transformer_block"))
    session = JudgeSession(InProcessKernel(monkeypatch, namespace), timeout=60)
    model = lab04.ProbeModel()
    module = build_module(
        session.lookup("TaggingModule"),
        "TaggingModule",
        model,
        ban=lab04.MODULE_BAN,
        lr=0.01,
        weight_decay=0.1,
        warmup_steps=2,
        total_steps=5,
    )
    assert module.model is model  # the check's own model, not a copy
    tokens = torch.randint(1, 7, (2, 4))
    batch = {"tokens": tokens, "padding_mask": tokens > 0, "targets": tokens % 5}
    loss, calls = run_training_step(module, batch, lab04.MODULE_BAN)
    loss.backward()
    assert model.head.weight.grad is not None and model.head.weight.grad.abs().sum() > 0
    assert [c.name for c in calls] == ["train_loss"]
    optimizer = module.configure_optimizers()["optimizer"]
    assert isinstance(optimizer, torch.optim.AdamW)
    ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert ids == {id(p) for p in model.parameters()}


def test_dropout_draws_from_the_judges_random_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel is another process with its own generator; a call draws from the judge's."""
    namespace = dict(_base("04_transformer_block"))
    session = JudgeSession(InProcessKernel(monkeypatch, namespace), timeout=60)
    ff = session.lookup("FeedForward")(4, 16, dropout=0.5).train()
    x = torch.ones(2, 3, 4)
    torch.manual_seed(7)
    first, second = ff(x), ff(x)  # consecutive calls go on along one stream
    torch.manual_seed(7)
    assert torch.equal(ff(x), first) and torch.equal(ff(x), second)
    assert not torch.equal(first, second)
    torch.manual_seed(7)
    local = torch.nn.functional.dropout(torch.ones(2, 3, 16), 0.5)  # noqa: F841 (a draw here)
    assert not torch.equal(ff(x), first)  # the check drew in between: the call goes on from it


def test_the_kernel_cannot_set_the_judges_random_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    namespace = dict(_base("04_transformer_block"))

    def reseeds(x: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(0)  # the student's code picks the stream the check goes on with
        return x

    namespace["reseeds"] = reseeds
    session = JudgeSession(InProcessKernel(monkeypatch, namespace), timeout=60)
    torch.manual_seed(123)
    session.lookup("reseeds")(torch.ones(1))
    chosen = torch.rand(3, generator=torch.Generator().manual_seed(0))
    ours = torch.Generator().manual_seed(123)
    torch.rand((), generator=ours)  # the judge's stream moves on by one draw per call
    got = torch.rand(3)
    assert torch.equal(got, torch.rand(3, generator=ours)) and not torch.equal(got, chosen)


# ---------------------------------------------------------------- lab 06: TranslationModule


def test_the_solutions_translation_module_passes_through_the_judge(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checks = judged(monkeypatch, "06_decoder_training", "TranslationModule", TRANSLATION_CELLS)
    answer = _base("06_decoder_training")["TranslationModule"]
    assert run_checks(checks, answer) == dict.fromkeys(TRANSLATION_CELLS, "")


TRAIN, VALIDATION, OPTIM = (["training_step", "hidden"], ["validation_step", "hidden"],
                            ["configure_optimizers", "hidden"])  # fmt: skip


@pytest.mark.parametrize(
    ("cls", "failing", "words"),
    [
        (
            "ModuleCountsPadding",
            [*TRAIN, "validation_step"],
            {**dict.fromkeys(TRAIN, "counts the padding"), "validation_step": "val_loss is"},
        ),
        ("ModuleReturnsDetached", TRAIN, "without its autograd graph"),
        ("ModuleNoLog", TRAIN, "logged nothing"),
        ("ModuleKeepsGraph", TRAIN, "self.losses[0] holds a tensor with its autograd"),
        ("ModuleBatchAccuracy", VALIDATION, "val_acc is"),
        ("ModuleNeverReset", VALIDATION, "(second run, other sentences)"),
        ("ModuleNoExactMatch", VALIDATION, "not 'val_exact_match'"),
        ("ModuleHardCodedLr", OPTIM, "peaks at 0.001 at step 0"),
        ("ModuleSubset", OPTIM, "leaves out"),
        ("ModulePerEpoch", OPTIM, "once per EPOCH"),
    ],
)
def test_each_translation_module_mistake_fails_through_the_judge_with_its_message(
    monkeypatch: pytest.MonkeyPatch, cls: str, failing: list[str], words: str
) -> None:
    checks = judged(monkeypatch, "06_decoder_training", "TranslationModule", TRANSLATION_CELLS)
    assert_fails(checks, getattr(t06, cls), failing, words)


@pytest.mark.parametrize(
    ("fn", "failing", "words"),
    [
        ("train", [], ""),
        ("train_fixed_precision", ["visible", "hidden"], "precision=session.precision"),
        ("train_default_logger", ["visible", "hidden"], "logs in"),
        ("train_without_validation", ["visible", "hidden"], "validated during the run False"),
        ("train_new_module", ["visible", "hidden"], "training steps of the module given 0"),
    ],
)
def test_train_translator_through_the_judge(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fn: str, failing: list[str], words: str
) -> None:
    monkeypatch.chdir(tmp_path)  # a default logger would write ./lightning_logs here
    session = Session(
        "06_decoder_training", torch.device("cpu"), "grading", "32-true", 1, tmp_path / "runs"
    )
    checks = judged(
        monkeypatch,
        "06_decoder_training",
        "train_translator",
        TRAIN_TRANSLATOR_CELLS,
        session=session,
    )
    assert_fails(checks, getattr(t06, fn), failing, words)


def test_a_reply_with_a_forged_random_state_earns_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rewritten kernel server whose replies carry a state that is no generator's."""
    from transformer_lab.judge import kernel, wire

    namespace = dict(_base("04_transformer_block"))
    link = InProcessKernel(monkeypatch, namespace)
    real = kernel.reply

    def forged() -> str:
        reply = wire.loads(real())
        if "rng" in reply:
            reply["rng"] = wire.encode(torch.zeros(3, dtype=torch.uint8))
        return wire.dumps(reply)

    monkeypatch.setattr(kernel, "reply", forged)
    verdict = judge_cell(
        "cell", "lab04.check_feed_forward(FeedForward)", JudgeSession(link, timeout=60)
    )
    assert not verdict.passed and "not a generator state" in verdict.message


def test_only_torchs_optimizers_and_schedulers_become_typed_remotes() -> None:
    from transformer_lab.grading.judge import Remote, _remote_class

    assert issubclass(_remote_class("torch.optim.adamw.AdamW"), torch.optim.AdamW)
    for claimed in ("os.system", "torch.nn.modules.linear.Linear", "torch.optim.nothing", None):
        assert _remote_class(claimed) is Remote


TRAINED_TRANSLATOR_CELLS = {
    "visible": "lab06.check_trained_translator(translator, data, DecoderBlock)",
    "greedy": HIDDEN06 + "hidden06.hidden_check_translator_greedy(translator, data, seed=642)",
}


@pytest.mark.parametrize(
    ("data", "failing", "words"),
    [
        ("trained", [], ""),
        ("settings not numbers", ["visible", "greedy"], "keep the data cell"),
        ("no settings", ["visible", "greedy"], "keep the data cell"),
        ("other settings", ["visible", "greedy"], "keep the data cell"),
        ("settings not a dict", ["visible", "greedy"], "keep the data cell"),
    ],
)
def test_the_trained_translator_cells_through_the_judge(
    monkeypatch: pytest.MonkeyPatch, data: str, failing: list[str], words: str
) -> None:
    """The judge rebuilds the DataModule from its settings: a trained translator passes; a
    ``data`` that is not the notebook's DataModule fails with the data cell named."""
    model, trusted = t06.trained_translator(_base("06_decoder_training")["DecoderBlock"])
    not_numbers = SimpleNamespace(hparams={"task": "translation", "sentences": ["the dog ran"]})
    other = SimpleNamespace(hparams={"sentences": 100, "batch_size": 32})
    given = {"trained": trusted, "settings not numbers": not_numbers, "no settings": object()}
    given["other settings"] = other
    given["settings not a dict"] = SimpleNamespace(hparams=5)
    block = _base("06_decoder_training")["DecoderBlock"]
    extra = {"data": given[data], "DecoderBlock": block}
    checks = judged(
        monkeypatch, "06_decoder_training", "translator", TRAINED_TRANSLATOR_CELLS, **extra
    )
    assert_fails(checks, model, failing, words)
