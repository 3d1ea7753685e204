"""No check passes an answer that ignores its inputs (issue 41, class 2).

A visible check whose cases a constant answer satisfies gives its points to an answer that
returns a stored table (lab 01's ``relative_shift_matrix`` shape check, offset 0 only, passed
``torch.eye``). For every graded function of every lab (the parts listed by the specs), the
honest solution is made constant: it computes its answer for the first call it gets and returns
that for every later call. Each test cell of the part must fail on it, judged by the real
judge over the kernel's server.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import nbformat
import pytest
from judge_support import TRAINED_MODEL, InProcessKernel, answers_namespace, function_parts

from transformer_lab.checks.spec import parts_of
from transformer_lab.grading.grade import judge_plan
from transformer_lab.grading.judge import JudgeSession, judge_cell

REPO = Path(__file__).resolve().parents[1]


def constant(fn: Any) -> Any:
    """``fn`` answering every call with what it returned for the first."""
    first: list[tuple[Any, BaseException | None]] = []

    def answer(*args: Any, **kwargs: Any) -> Any:
        if not first:
            try:
                first.append((fn(*args, **kwargs), None))
            except Exception as exc:  # (a check's first case may be one that must raise)
                first.append((None, exc))
        value, error = first[0]
        if error is not None:
            raise error
        return value

    answer.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    return answer


@pytest.mark.parametrize(("lab", "part"), function_parts(), ids=lambda v: str(v))
def test_a_constant_answer_fails_every_cell_of_its_part(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, lab: str, part: str
) -> None:
    monkeypatch.chdir(tmp_path)  # (a lab's setup may write its logs where it runs)
    source = nbformat.read(str(REPO / "solutions" / lab / f"{lab}.ipynb"), 4)
    plan = judge_plan(source)
    passed = []
    for cell in parts_of(source)[part]:
        if cell in TRAINED_MODEL:
            continue
        namespace = answers_namespace(lab)
        namespace[part] = constant(namespace[part])
        link = InProcessKernel(monkeypatch, namespace)
        session = JudgeSession(link, timeout=60, hidden=plan[cell]["hidden"])
        verdict = judge_cell(cell, plan[cell]["source"], session)
        if verdict.passed:
            passed.append(cell)
    assert passed == [], f"a constant {part} passes {passed}"
