"""One mistake costs only its own cells: later answers are judged on a reference for it.

When an answer fails its own test cells, a later answer that calls it by name
(``MultiHeadAttention`` calls ``split_heads``; ``TranslationModule`` calls ``sequence_loss``) is
judged with PyTorch's stand-in in its place (``builds_on`` in the lab's spec), and its message
says so.
The cells run in the notebook's order through :class:`~transformer_lab.grading.judge.Judgements`,
as ``BudgetedExecute`` runs them.
"""

from __future__ import annotations

from typing import Any

import nbformat
import pytest
import torch
from judge_support import REPO, InProcessKernel, answers_namespace

from transformer_lab.grading.grade import judge_plan
from transformer_lab.grading.judge import Judgements, JudgeSession


def _judge_all(monkeypatch: pytest.MonkeyPatch, lab: str, **answers: Any) -> dict[str, Any]:
    source = nbformat.read(str(REPO / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
    namespace = {**answers_namespace(lab), **answers}
    session = JudgeSession(InProcessKernel(monkeypatch, namespace), timeout=120)
    judgements = Judgements()
    for grade_id, cell in judge_plan(source).items():
        if not grade_id.startswith(("test_train_translator", "test_trained")):  # need training
            judgements.judge(grade_id, cell["source"], session)
    return judgements.verdicts


def _failed_cells(verdicts: dict[str, Any]) -> list[str]:
    return sorted(g for g, v in verdicts.items() if not v["passed"])


def split_heads_without_transpose(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    B, T, D = x.shape
    return x.reshape(B, n_heads, T, D // n_heads)  # (B, H, T, Dh) with the wrong layout


def test_a_split_heads_mistake_costs_only_the_split_heads_cells(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    verdicts = _judge_all(
        monkeypatch, "03_multi_head_attention", split_heads=split_heads_without_transpose
    )
    failed = _failed_cells(verdicts)
    assert failed and all(g.startswith("test_split_heads") for g in failed), failed
    mha = verdicts["test_mha_visible"]
    assert mha["passed"] and "checked with PyTorch's `split_heads`" in mha["message"]
    assert "because your `split_heads` fails its own check" in mha["message"]


def test_the_notebooks_own_answer_is_back_after_a_cell_on_stand_ins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    namespace = {**answers_namespace("03_multi_head_attention")}
    namespace["split_heads"] = split_heads_without_transpose
    session = JudgeSession(InProcessKernel(monkeypatch, namespace), timeout=60)
    judgements = Judgements()
    judgements.failed.add("split_heads")
    verdict = judgements.judge(
        "cell", "lab03.check_multi_head_attention(MultiHeadAttention)", session
    )
    assert verdict.passed and "checked with PyTorch's `split_heads`" in verdict.message
    assert namespace["split_heads"] is split_heads_without_transpose


def sequence_loss_over_padding(logits: torch.Tensor, targets: torch.Tensor, pad_id: int):
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def test_a_sequence_loss_mistake_leaves_the_translation_module_its_points(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    verdicts = _judge_all(
        monkeypatch, "06_decoder_training", sequence_loss=sequence_loss_over_padding
    )
    failed = _failed_cells(verdicts)
    assert failed and all(g.startswith("test_sequence_loss") for g in failed), failed
    step = verdicts["test_translation_module_training_step"]
    assert step["passed"] and "`sequence_loss`" in step["message"]
