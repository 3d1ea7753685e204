"""The grader's own bounds, without a kernel: measured by counts, never by the clock.

* the judge's time is one deadline per judged cell, whatever the number of requests;
* a reply is refused by its size and by its number of values before JSON builds anything;
* :func:`~transformer_lab.grading.repair.repair_notebook`'s work grows linearly with the cells;
* the grader's work on a submission in its bounded child: an exception, memory, a hang or a
  kill is that submission's result, said in a sentence, and the grader goes on.

The same attacks through the real ``labs grade`` are in ``tests/test_grading_bounds_attacks.py``.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest

from transformer_lab.grading import isolate, judge, repair
from transformer_lab.grading.judge import JudgeError, JudgeSession
from transformer_lab.judge import wire

REPO = Path(__file__).resolve().parents[1]
LAB = "01_positional_encoding"


# -- one deadline per judged cell --------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class _SlowLink:
    """A kernel whose every answer takes ``step`` seconds of a fake clock."""

    def __init__(self, clock: _Clock, step: float) -> None:
        self.clock, self.step, self.timeouts = clock, step, []

    def exchange(self, text: str, timeout: float, answer: Any) -> str:
        self.timeouts.append(timeout)
        if self.step > timeout:  # what the real link does: give up at the time it was given
            self.clock.now += timeout
            raise JudgeError(f"your code did not return within {timeout:.0f} s")
        self.clock.now += self.step
        return wire.dumps({"ok": True, "value": 1})


def test_a_judged_cell_has_one_deadline_for_all_its_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _Clock()
    monkeypatch.setattr(judge, "time", clock)
    link = _SlowLink(clock, step=4.0)
    session = JudgeSession(link, timeout=10)
    answered = 0
    with pytest.raises(JudgeError, match="did not return within 10 s") as caught:
        for _ in range(50):  # a cell of many slow requests: 4 s each, under 10 s each
            session.request({"op": "lookup", "name": "x"})
            answered += 1
    assert answered == 2 and session.requests == 2
    assert link.timeouts == [10.0, 6.0, 2.0]  # each exchange gets only the time left
    assert "all its calls together" in str(caught.value)
    # Spent before the next request: refused without asking the kernel.
    with pytest.raises(JudgeError, match="within 10 s"):
        session.request({"op": "lookup", "name": "x"})
    assert len(link.timeouts) == 3


# -- replies bounded before they are built ---------------------------------------------------


def _values(data: Any) -> int:
    """The JSON values (keys included) of decoded ``data``."""
    if isinstance(data, list):
        return 1 + sum(_values(v) for v in data)
    if isinstance(data, dict):
        return 1 + sum(1 + _values(v) for v in data.values())
    return 1


@pytest.mark.parametrize(
    "text",
    [
        '{"ok":true,"value":[[],[[]],{"a":1,"b":[2,3]}]}',
        '{"s":"a,b:[{","n":null,"t":{"$tuple":[1.5,-2,"x"]}}',
        wire.dumps({"ok": True, "value": wire.encode([[1, 2], (3, {"k": [4]})])}),
        "{}",
    ],
)
def test_the_prescan_bounds_the_values_json_builds(text: str) -> None:
    assert wire.count_items(text) >= _values(json.loads(text))


def test_nested_empty_lists_are_refused_before_json_builds_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[str] = []
    monkeypatch.setattr(wire.json, "loads", lambda text: built.append(text))
    lists = wire.MAX_ITEMS  # 3 characters each: ~3 MiB of text for a million objects
    bomb = '{"ok":true,"value":[' + "[]," * lists + "[]]}"
    with pytest.raises(wire.WireError, match=f"holds more than {wire.MAX_ITEMS}"):
        wire.loads(bomb)
    assert built == []  # refused by the count, nothing parsed


def test_an_oversized_reply_is_refused_by_its_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "MAX_BYTES", 1000)
    text = wire.dumps({"ok": True, "value": "x" * 1000})
    with pytest.raises(wire.WireError, match="larger than 1000"):
        wire.loads(text)


def test_the_judge_reports_a_refused_reply_and_stops_reading() -> None:
    class Bomb:
        def exchange(self, text: str, timeout: float, answer: Any) -> str:
            return '{"ok":true,"value":[' + "[]," * wire.MAX_ITEMS + "[]]}"

    with pytest.raises(JudgeError, match=r"not data the judge reads .*holds more than"):
        JudgeSession(Bomb(), timeout=10).request({"op": "lookup", "name": "x"})


# -- repair_notebook: linear in the submission ------------------------------------------------


@pytest.fixture(scope="module")
def release() -> nbformat.NotebookNode:
    return nbformat.read(str(REPO / "labs" / LAB / f"{LAB}.ipynb"), as_version=4)


def _hostile(release: nbformat.NotebookNode, per_gap: int, size: int) -> Any:
    """The release, metadata stripped and answers filled in (so matching needs similarity),
    with ``per_gap`` long cells before every answer cell: gaps full of candidates."""
    nb = copy.deepcopy(release)
    answers = []
    for i, cell in enumerate(nb.cells):
        meta = cell.metadata.pop("nbgrader", None)
        if meta and meta.get("solution"):
            cell.source = cell.source.replace("raise NotImplementedError()", "return 1")
            answers.append(i)
    filler = (" " * 7 + "x") * (size // 8)  # what makes difflib slowest against code
    for i in reversed(answers):
        for _ in range(per_gap):
            nb.cells.insert(i, nbformat.v4.new_code_cell(filler))
    return nb


def _work(release: Any, nb: Any) -> tuple[int, list[int], Any]:
    """The matcher's steps on ``nb``, the characters each similarity read, and the result."""
    seen: list[int] = []
    steps: list[int] = []
    with pytest.MonkeyPatch.context() as patch:
        original, report = repair._similarity, repair._report_missing

        def counted(a: str, b: str) -> float:
            seen.append(len(a[: repair.SIMILAR_CHARS]) + len(b[: repair.SIMILAR_CHARS]))
            return original(a, b)

        def spy(m: Any, actions: list[str]) -> None:
            steps.append(m.work)
            report(m, actions)

        patch.setattr(repair, "_similarity", counted)
        patch.setattr(repair, "_report_missing", spy)
        result = repair.repair_notebook(nb, release)
    return steps[0], seen, result


def test_repair_work_grows_linearly_and_similarity_is_bounded(
    release: nbformat.NotebookNode,
) -> None:
    answers = sum(1 for c in release.cells if c.metadata.get("nbgrader", {}).get("solution"))
    small_work, _, small = _work(release, _hostile(release, 40, 4000))
    large_work, large_seen, large = _work(release, _hostile(release, 320, 8000))
    assert small.ok and large.ok  # the answers are still found among the long cells
    assert small.matched == large.matched == small.expected
    # 8x the cells, 2x the characters: the work grows with the cells, not their square ...
    assert large_work <= 9 * small_work
    # ... and similarity (the only quadratic comparison) stays a constant per answer cell.
    assert len(large_seen) <= answers * repair.CANDIDATES
    assert max(large_seen) <= 2 * repair.SIMILAR_CHARS


def test_a_notebook_of_too_many_cells_is_unmatched_unread(
    release: nbformat.NotebookNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    nb = copy.deepcopy(release)
    nb.cells += [nbformat.v4.new_markdown_cell("x") for _ in range(repair.MAX_CELLS)]
    monkeypatch.setattr(repair.copy, "deepcopy", lambda value: pytest.fail("copied"))
    result = repair.repair_notebook(nb, release)
    assert not result.ok
    assert f"more than the {repair.MAX_CELLS} the grader matches" in result.reason


# -- the grader's work on one submission, bounded ----------------------------------------------


def _value(x: int) -> dict[str, int]:
    return {"double": 2 * x}


def _raises(x: int) -> None:
    raise ValueError(f"a broken notebook {x}")


def _eats_memory(x: int) -> bytearray:
    return bytearray(8 * 2**30)  # more than the limit of 4 GiB: refused before it is touched


def _hangs(x: int) -> None:
    while True:
        time.sleep(0.05)


def _killed(x: int) -> None:
    os.kill(os.getpid(), signal.SIGKILL)  # what the system's out-of-memory killer does


BOUNDS = isolate.Bounds(memory_bytes=0, seconds=60, grace_s=2)


def test_the_bounded_child_returns_its_value() -> None:
    outcome = isolate.run_bounded(_value, 21, BOUNDS)
    assert outcome.ok and outcome.value == {"double": 42}


@pytest.mark.parametrize(
    ("func", "bounds", "said"),
    [
        (_raises, BOUNDS, "ValueError: a broken notebook 7"),
        (
            _eats_memory,
            isolate.Bounds(memory_bytes=4 * 2**30, seconds=60),
            "ran out of memory (its limit: 4 GiB)",
        ),
        (_hangs, isolate.Bounds(0, seconds=1, grace_s=1), "stopped its work on this submission"),
        (_killed, BOUNDS, "killed (SIGKILL: most likely its"),
    ],
    ids=["exception", "memory", "deadline", "killed"],
)
def test_a_failure_of_the_graders_work_is_said_and_the_grader_goes_on(
    func: Any, bounds: isolate.Bounds, said: str
) -> None:
    outcome = isolate.run_bounded(func, 7, bounds)
    assert not outcome.ok and said in outcome.failure, outcome.failure
    assert isolate.run_bounded(_value, 1, BOUNDS).value == {"double": 2}  # and the next one
