"""What each typical mistake costs, through the judge, is what its lab's spec says.

Every entry of the kit's catalogue (``mistake_catalogue.ENTRIES``: 370-odd wrong answers across
labs 01-08) is put in place of its part in the solution's namespace, and the lab's test cells
are judged in the notebook's order by the grader's own judge (:class:`Judgements`, the kernel
served in this process): the cells that fail must be exactly the ones the spec
(``transformer_lab/checks/specs/labNN.toml``) names for that mistake, all of them cells of the
mistake's own part, and the parts built on it keep their points; the first cell that loses
points (the first message the student reads) names the mistake. The cells judged are the
part's own; for the first mistake of each part, also those of every later part whose solution
calls it by name (the only cells a mistake can reach), which is what keeps this test within
CI's time; ``TRANSFORMER_LAB_ALL_CELLS=1`` judges every cell of the lab for every mistake (run
before a release: 6 minutes on 2 cores).
Cells that judge the model a demo cell trained (``TRAINED_MODEL``) are judged by the round
trips (what a ``train_translator`` mistake costs there was measured through the real ``labs
grade``); lab 06's Trainer-settings cells train a stand-in for a few steps and are judged. Every
correct variant the checks' tests hold (``mistake_catalogue.CORRECT``) keeps its part's points
through the judge too.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Any

import nbformat
import pytest
from judge_support import REPO, TRAINED_MODEL, InProcessKernel, answers_namespace
from mistake_catalogue import CORRECT, ENTRIES, Correct, Entry
from test_diagnosis import RECORDED

from transformer_lab.checks import spec
from transformer_lab.grading.grade import judge_plan
from transformer_lab.grading.judge import Judgements, JudgeSession

ALL_CELLS = os.environ.get("TRANSFORMER_LAB_ALL_CELLS") == "1"
#: Correct variants the judge still scores below the checks run in one process (open work).
JUDGE_GAPS: dict[str, str] = {}
#: Catalogued mistakes whose first lost cell does not yet name them through the judge (open
#: work): the entry and what the student reads first instead.
FIRST_MESSAGE_GAPS: dict[str, str] = {}
#: Words of the grader's internals that no message may hold.
INTERNALS = ("MirrorModule", "GraderModule", "Remote(", "wire.", "The check could not run")


@functools.cache
def _notebook(lab: str) -> Any:
    return nbformat.read(str(REPO / "solutions" / lab / f"{lab}.ipynb"), as_version=4)


@functools.cache
def _answers(lab: str) -> dict[str, str]:
    """Part -> the source of its solution's answer cells."""
    found: dict[str, str] = {}
    current = None
    for cell in _notebook(lab).cells:
        markdown = cell.cell_type == "markdown"
        heading = spec.EXERCISE_HEADING.search(cell.source) if markdown else None
        if heading:
            current = heading.group(3)
        answer = cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution")
        if current and answer:
            found[current] = found.get(current, "") + cell.source
    return found


@functools.cache
def _namespace(lab: str) -> dict[str, Any]:
    return answers_namespace(lab)


def _reached(entry: Entry) -> list[str]:
    """The test cells judged for ``entry``: its part's; for the part's first catalogued
    mistake, also those of every later part whose solution calls it by name; with
    ``ALL_CELLS``, every cell of the lab."""
    parts = spec.parts_of(_notebook(entry.lab))
    names = list(parts)
    reached = [entry.function]
    first = next(e for e in ENTRIES if e.lab == entry.lab and e.function == entry.function)
    if entry is first:
        calls = re.compile(rf"\b{re.escape(entry.function)}\b")
        later = names[names.index(entry.function) + 1 :]
        reached += [n for n in later if calls.search(_answers(entry.lab).get(n, ""))]
    return [c for n in (names if ALL_CELLS else reached) for c in parts[n]]


def _key(entry: Entry) -> str:
    return entry.id.split(" ", 1)[1]


def test_the_catalogue_and_the_specs_name_the_same_mistakes() -> None:
    declared = {
        (s.lab, part.name, key) for s in spec.all_specs() for part in s.parts.values()
        for key in part.mistakes
    }  # fmt: skip
    catalogued = {(e.lab, e.function, _key(e)) for e in ENTRIES}
    assert not catalogued - declared, f"catalogued, not in a spec: {sorted(catalogued - declared)}"
    assert not declared - catalogued, f"in a spec, not catalogued: {sorted(declared - catalogued)}"


@pytest.mark.parametrize("lab_spec", spec.all_specs(), ids=lambda s: s.lab)
def test_a_mistake_costs_cells_of_its_own_part_only(lab_spec: spec.LabSpec) -> None:
    parts = spec.parts_of(_notebook(lab_spec.lab))
    for part in lab_spec.parts.values():
        for key, cells in part.mistakes.items():
            assert cells, f"{lab_spec.lab} {key}: a catalogued mistake must cost something"
            foreign = set(cells) - set(parts[part.name])
            assert not foreign, f"{lab_spec.lab} {key} costs cells of other parts: {foreign}"


@pytest.mark.filterwarnings("ignore:The use of `x.T`")
@pytest.mark.parametrize("entry", ENTRIES, ids=[e.id for e in ENTRIES])
def test_a_mistake_loses_exactly_the_cells_its_spec_names(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, entry: Entry
) -> None:
    monkeypatch.chdir(tmp_path)  # a Trainer's logs (lab 06) go here
    declared = set(spec.load(entry.lab).parts[entry.function].mistakes[_key(entry)])
    declared -= TRAINED_MODEL
    plan = judge_plan(_notebook(entry.lab))
    reached = set(_reached(entry)) - TRAINED_MODEL
    namespace = {**_namespace(entry.lab), entry.function: entry.answer}
    session = JudgeSession(InProcessKernel(monkeypatch, namespace), timeout=120)
    judgements = Judgements()
    for grade_id, cell in plan.items():
        if grade_id in reached:
            judgements.judge(grade_id, cell["source"], session)
    verdicts = judgements.verdicts
    failed = [g for g, v in verdicts.items() if not v["passed"]]
    assert sorted(failed) == sorted(declared), {g: verdicts[g]["message"][:300] for g in failed}
    for grade_id in failed:
        assert verdicts[grade_id]["message"], grade_id  # every lost point says why
    first = next(g for g in plan if g in failed)  # the first message the student reads
    message = verdicts[first]["message"]
    if entry.id in FIRST_MESSAGE_GAPS:
        pytest.xfail(FIRST_MESSAGE_GAPS[entry.id])
    assert not [w for w in INTERNALS if w in message], (first, message)
    # A check the catalogue calls generic for this mistake (a comparison with torch's own
    # layer) says which symptom it saw and what to check; every other names the mistake.
    assert entry.generic or _names(entry, message), (first, message)


def _names(entry: Entry, message: str) -> bool:
    """Whether ``message`` names ``entry``'s mistake: the catalogue's words for it (one of
    them, where its checks say it in different words), or the rule it breaks where the
    catalogue records that (test_diagnosis.RECORDED: the function at fault runs in the kernel,
    out of the judge's sight)."""
    words = [entry.words] if isinstance(entry.words, str) else list(entry.words.values())
    words += [RECORDED[entry.id]] if entry.id in RECORDED else []
    return any(w.lower() in message.lower() for w in words)


@pytest.mark.parametrize("variant", CORRECT, ids=lambda c: c.id)
def test_a_correct_variant_keeps_every_point_of_its_part_through_the_judge(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, variant: Correct
) -> None:
    """What passes the checks in one process passes them through the judge: a NumPy bool
    answer, a gradient through the check's function (lab 05's detectors), a Jacobian, a
    ``{"loss": loss}`` training step."""
    if variant.id in JUDGE_GAPS:
        pytest.xfail(JUDGE_GAPS[variant.id])
    monkeypatch.chdir(tmp_path)  # a Trainer's logs (lab 06) go here
    cells = spec.parts_of(_notebook(variant.lab))[variant.function]
    namespace = {**_namespace(variant.lab), variant.function: variant.answer}
    session = JudgeSession(InProcessKernel(monkeypatch, namespace), timeout=120)
    judgements = Judgements()
    for grade_id, cell in judge_plan(_notebook(variant.lab)).items():
        if grade_id in cells and grade_id not in TRAINED_MODEL:
            judgements.judge(grade_id, cell["source"], session)
    assert judgements.verdicts
    failed = {g: v["message"][:300] for g, v in judgements.verdicts.items() if not v["passed"]}
    assert not failed, failed
