"""Visible points on inputs the student has never seen (issue 41, class 2).

A visible check's worked examples ship with their expected values in the student package
(``checks/fixtures/labNN.json``), so an answer that looks the stored table up would pass them.
The judge also grades a visible cell on cases drawn at grading time
(:mod:`transformer_lab.grading.drawn`). For every graded function of every lab whose inputs a
drawn case can be made of, a *table lookup* (the honest answer on exactly the inputs the visible
check used, zeros elsewhere) passes the worked examples alone and fails once drawn cases are
judged; the honest answer passes both. Judged by the real judge over the kernel's server.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import nbformat
import pytest
import torch
from judge_support import TRAINED_MODEL, InProcessKernel, answers_namespace, function_parts

from transformer_lab.checks.spec import parts_of
from transformer_lab.grading import drawn
from transformer_lab.grading.grade import judge_plan
from transformer_lab.grading.judge import JudgeSession, judge_cell

REPO = Path(__file__).resolve().parents[1]

#: Graded functions whose visible calls pass a model, a function or an object of the student's
#: (no drawn case is made of those: their visible points rest on the worked examples and the
#: hidden checks), or whose part the kit answers with no function of that name.
OUT_OF_REACH = {
    "load_torch_weights": "takes the student's module and torch's",
    "depends_on_future": "takes a function",
    "train_translator": "takes a model and data; no kit function of that name",
    "greedy_decode": "takes a model",
    "generate": "takes a model",
    "beam_search": "takes a model's step function",
    "combine_masks": "takes boolean masks only, whose structure (causal) no redraw keeps",
}


def _key(args: Any, kwargs: Any) -> Any:
    return drawn._key((tuple(args), dict(kwargs)))


def _garbage(value: Any) -> Any:
    """Something of ``value``'s kind that is not ``value``."""
    if type(value) is torch.Tensor:
        if value.dtype == torch.bool:
            return ~value
        return torch.zeros_like(value) if bool(value.any()) else torch.ones_like(value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return 2 * value + 1
    if isinstance(value, str):
        return value + "?"
    if isinstance(value, list | tuple):
        return type(value)()
    return None


def table_lookup(fn: Any, table: set[Any]) -> Any:
    """``fn`` on the inputs of ``table`` (those a visible check used); garbage elsewhere."""

    def answer(*args: Any, **kwargs: Any) -> Any:
        value = fn(*args, **kwargs)
        return value if _key(args, kwargs) in table else _garbage(value)

    answer.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    return answer


def recording(fn: Any, table: set[Any]) -> Any:
    """``fn``, adding the inputs of every call to ``table``."""

    def answer(*args: Any, **kwargs: Any) -> Any:
        table.add(_key(args, kwargs))
        return fn(*args, **kwargs)

    answer.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    return answer


def _judge(
    monkeypatch: pytest.MonkeyPatch, lab: str, cell: str, part: str, wrap: Any, draws: bool
) -> tuple[Any, JudgeSession]:
    source = nbformat.read(str(REPO / "solutions" / lab / f"{lab}.ipynb"), 4)
    namespace = answers_namespace(lab)
    namespace[part] = wrap(namespace[part])
    session = JudgeSession(InProcessKernel(monkeypatch, namespace), timeout=60, draws=draws)
    return judge_cell(cell, judge_plan(source)[cell]["source"], session), session


def _visible_cells(lab: str, part: str) -> list[str]:
    source = nbformat.read(str(REPO / "solutions" / lab / f"{lab}.ipynb"), 4)
    plan = judge_plan(source)
    cells = parts_of(source)[part]
    return [c for c in cells if not plan[c]["hidden"] and c not in TRAINED_MODEL]


def test_the_parts_out_of_reach_are_the_listed_ones() -> None:
    """A new graded function is either drawn for or listed (with its reason) above."""
    functions = {part for _, part in function_parts()}
    assert set(OUT_OF_REACH) <= functions
    unanswered = {p for p in functions if drawn.kit_answer(p) is None}
    assert unanswered <= set(OUT_OF_REACH), unanswered


@pytest.mark.parametrize(("lab", "part"), function_parts(), ids=lambda v: str(v))
def test_a_table_lookup_fails_the_visible_cells_and_the_honest_answer_passes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, lab: str, part: str
) -> None:
    monkeypatch.chdir(tmp_path)  # (a lab's setup may write its logs where it runs)
    drawn_for = []
    for cell in _visible_cells(lab, part):
        honest, session = _judge(monkeypatch, lab, cell, part, lambda f: f, True)
        assert honest.passed, (cell, honest.message)
        if not session.drawn:
            continue
        drawn_for.append(cell)
        # The threat: the worked examples' inputs (recorded) looked up earn the cell's points
        # on the worked examples alone ...
        table: set[Any] = set()
        worked, _ = _judge(monkeypatch, lab, cell, part, lambda f, t=table: recording(f, t), False)
        alone, _ = _judge(
            monkeypatch, lab, cell, part, lambda f, t=table: table_lookup(f, t), False
        )
        assert worked.passed and alone.passed, (cell, alone.message)
        # ... and a case drawn at grading time takes them away, saying why.
        judged, _ = _judge(
            monkeypatch, lab, cell, part, lambda f, t=table: table_lookup(f, t), True
        )
        assert not judged.passed, cell
        assert "not a case drawn at grading time" in judged.message, judged.message
    if part in OUT_OF_REACH:
        assert drawn_for == [], f"{part} is drawn for now: take it off OUT_OF_REACH"
    else:
        assert drawn_for, f"no visible cell of {part} was judged on a drawn case"


def _drawn_inputs(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    lab, part = "02_self_attention", "softmax"
    _, session = _judge(monkeypatch, lab, "test_softmax_visible", part, lambda f: f, True)
    assert session.drawn
    return [case.call.args for case in session.drawn]


def test_the_drawn_inputs_differ_between_two_gradings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(drawn.DRAW_SEED_ENV, raising=False)  # (conftest pins it for the others)
    first, second = _drawn_inputs(monkeypatch), _drawn_inputs(monkeypatch)
    assert len(first) == len(second)
    assert drawn._key(first) != drawn._key(second)
    # the structure is kept: the same shapes and dtypes, only the values are new
    for a, b in zip(first, second, strict=True):
        assert [(t.shape, t.dtype) for t in a] == [(t.shape, t.dtype) for t in b]


def test_the_message_names_the_drawn_call_and_no_internals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table: set[Any] = set()
    lab, cell, part = (
        "01_positional_encoding",
        "test_sinusoidal_encoding_values",
        "sinusoidal_encoding",
    )
    _judge(monkeypatch, lab, cell, part, lambda f: recording(f, table), False)
    verdict, session = _judge(monkeypatch, lab, cell, part, lambda f: table_lookup(f, table), True)
    assert not verdict.passed
    first = session.drawn[0].describe()  # e.g. sinusoidal_encoding(10, 8)
    assert first.startswith("sinusoidal_encoding(") and first in verdict.message
    assert "differs from the expected value at index" in verdict.message
    for internal in ("Remote", "Mirror", "handle", "kernel", "Drawn", "Call("):
        assert internal not in verdict.message, verdict.message


def test_a_hidden_cell_draws_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hidden cells draw their own random cases already, and their messages stay fixed words."""
    lab, part = "01_positional_encoding", "sinusoidal_encoding"
    source = nbformat.read(str(REPO / "solutions" / lab / f"{lab}.ipynb"), 4)
    plan = judge_plan(source)
    (cell,) = [c for c in parts_of(source)[part] if plan[c]["hidden"]][:1]
    session = JudgeSession(
        InProcessKernel(monkeypatch, answers_namespace(lab)), timeout=60, hidden=True
    )
    assert judge_cell(cell, plan[cell]["source"], session).passed
    assert session.drawn == []


def test_a_pinned_seed_draws_the_same_cases_and_a_bad_one_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(drawn.DRAW_SEED_ENV, "12345")
    assert drawn._key(_drawn_inputs(monkeypatch)) == drawn._key(_drawn_inputs(monkeypatch))
    monkeypatch.setenv(drawn.DRAW_SEED_ENV, "tuesday")
    with pytest.raises(ValueError, match="TRANSFORMER_LAB_DRAW_SEED='tuesday' is not an integer"):
        drawn.grading_seed()


#: Lab 01's sinusoidal_encoding as a table lookup a student could write without importing or
#: pasting anything the grader flags: honest on the sizes the visible checks call, zeros on any
#: other size.
LOOKUP_GUARD = """\
    if (seq_len, d_model) not in {(4, 6), (5, 4), (6, 8), (3, 4), (12, 6), (3, 2), (2, 4)}:
        return torch.zeros(seq_len, d_model)
"""


@pytest.mark.slow
def test_labs_grade_takes_a_visible_cells_points_from_a_table_lookup(tmp_path: Path) -> None:
    """The real ``labs grade`` (sandboxed where the tests require it): the lookup loses the
    visible values cell, with the drawn case named, and is not flagged (a plain wrong answer);
    its other answer keeps its points."""
    from judge_support import grade_one, with_code_first_in_answer

    lab = "01_positional_encoding"
    nb = with_code_first_in_answer(lab, "sinusoidal_encoding", LOOKUP_GUARD)
    result = grade_one(tmp_path / "course", "lookup", lab, nb)
    assert result["status"] == "graded" and not result["flags"], result
    values = result["verdicts"]["test_sinusoidal_encoding_values"]
    assert values["score"] == 0.0, result
    assert "not a case drawn at grading time: sinusoidal_encoding(" in values["message"]
    for part in ("shape", "values", "hidden", "properties"):
        verdict = result["verdicts"][f"test_relative_shift_matrix_{part}"]
        assert verdict["score"] == verdict["max_score"], result
