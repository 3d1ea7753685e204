"""The judge on Lightning modules: lab 04's ``TaggingModule`` judged from outside its kernel.

The student's ``LightningModule`` stays in the kernel; the check's tagging model goes into it as
a portable model (rebuilt there, so the student's loss has its graph), its parameters are the
judge's own (the loss's backward reaches them), ``self.log`` is recorded by the check through
the kernel, and the optimizer and scheduler ``configure_optimizers`` returns are read as torch's
classes whose parameter groups hold the judge's parameters. Every typical mistake of the kit's
catalogue (``tests/test_lab04_checks.py``) fails both cells with its own message; a correct
module passes.
"""

from __future__ import annotations

import pytest
import torch
from judge_support import InProcessKernel, answers_namespace
from test_lab04_checks import module_with

from transformer_lab.checks import lab04
from transformer_lab.grading.judge import JudgeSession, judge_cell

LAB = "04_transformer_block"

CELLS = {
    "training_step": (
        "lab04.check_training_step(TaggingModule)",
        "from transformer_lab.grading.hidden import lab04 as hidden04\n"
        "hidden04.hidden_check_training_step(TaggingModule, seed=4401)",
    ),
    "configure_optimizers": (
        "lab04.check_configure_optimizers(TaggingModule)",
        "from transformer_lab.grading.hidden import lab04 as hidden04\n"
        "hidden04.hidden_check_configure_optimizers(TaggingModule, seed=4402)",
    ),
}

TRAINING_STEP_MISTAKES = {
    "mean_over_padding": "padding included",
    "sum": "the sum over the real tokens",
    "no_mask": "without the padding mask",
    "returns_item": "not loss.item()",
    "returns_detached": "without its autograd graph",
    "no_log": "logged nothing",
    "log_name": "under the name 'train_loss'",
    "log_item": "makes the CPU wait for the GPU",
    "enable_graph": "keeps the step's whole autograd graph",
    "keeps_graph": "self.history[0] holds a tensor with its autograd",
}
OPTIMIZER_MISTAKES = {
    "adam": "decays the weights directly",
    "no_decay": "has weight_decay=0",
    "subset": "does not update",
    "no_scheduler": "without a learning-rate schedule",
    "per_epoch": "every 1 epoch(s)",
    "no_warmup": "It has no warm-up",
    "linear_decay": "It decays linearly",
}


def _verdicts(monkeypatch: pytest.MonkeyPatch, cls: type, part: str) -> list:
    namespace = answers_namespace(LAB)
    namespace["TaggingModule"] = cls
    session = JudgeSession(InProcessKernel(monkeypatch, namespace), timeout=60)
    return [judge_cell(f"{part}_{i}", source, session) for i, source in enumerate(CELLS[part])]


@pytest.mark.parametrize("part", sorted(CELLS))
def test_the_solutions_module_passes_through_the_judge(
    monkeypatch: pytest.MonkeyPatch, part: str
) -> None:
    cls = answers_namespace(LAB)["TaggingModule"]
    for verdict in _verdicts(monkeypatch, cls, part):
        assert verdict.passed, verdict.message


@pytest.mark.parametrize(
    ("part", "mistake", "words"),
    [("training_step", m, w) for m, w in TRAINING_STEP_MISTAKES.items()]
    + [("configure_optimizers", m, w) for m, w in OPTIMIZER_MISTAKES.items()],
)
def test_each_lightning_mistake_fails_through_the_judge_with_its_message(
    monkeypatch: pytest.MonkeyPatch, part: str, mistake: str, words: str
) -> None:
    for verdict in _verdicts(monkeypatch, module_with(mistake), part):
        assert not verdict.passed and words in verdict.message, (mistake, verdict.message)


def test_the_checks_model_gets_the_gradients_and_the_optimizer_its_parameters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    namespace = answers_namespace(LAB)
    session = JudgeSession(InProcessKernel(monkeypatch, namespace), timeout=60)
    model = lab04.ProbeModel()
    module = lab04.build_module(
        session.lookup("TaggingModule"),
        model,
        lr=0.01,
        weight_decay=0.1,
        warmup_steps=2,
        total_steps=5,
    )
    assert module.model is model  # the check's own model, not a copy
    tokens = torch.randint(1, 7, (2, 4))
    batch = {"tokens": tokens, "padding_mask": tokens > 0, "targets": tokens % 5}
    loss, calls = lab04.run_training_step(module, batch)
    loss.backward()
    assert model.head.weight.grad is not None and model.head.weight.grad.abs().sum() > 0
    assert [c.name for c in calls] == ["train_loss"]
    conf = module.configure_optimizers()
    optimizer = conf["optimizer"]
    assert isinstance(optimizer, torch.optim.AdamW)
    ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert ids == {id(p) for p in model.parameters()}
