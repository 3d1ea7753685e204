"""A lab's facts have one home, its spec: the tables that name labs are derived from the specs or
checked against them here (issue 36).

* the judge's namespace (the visible checks a test cell reads from the grader, never from the
  kernel) is every lab that has a spec, nothing more;
* ``answers.ANSWERS`` and ``standins.STAND_INS`` name only parts, labs and kit answers that the
  specs declare;
* a lab 09 started with ``transformer-lab labs new`` in a copy of the repository (a spec, a
  notebook, the kit's answer and the lab's oracle) is linted clean against its spec, and its
  visible test cell is judged in the grader: a notebook that reassigns ``lab09.check_example``
  earns nothing for it, and the kernel is never asked for ``lab09`` (in-process, and through
  the real ``labs build`` and ``labs grade``).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
import torch

from transformer_lab.answers import ANSWERS
from transformer_lab.checks import spec
from transformer_lab.checks.spec import all_specs
from transformer_lab.grading.judge import grader_namespace, lab_check_modules
from transformer_lab.standins import STAND_INS

REPO = Path(__file__).resolve().parents[1]


def test_the_judge_reads_the_checks_of_every_lab_with_a_spec_and_no_other() -> None:
    labs = [f"lab{spec.lab[:2]}" for spec in all_specs()]
    assert labs[:8] == [f"lab{n:02d}" for n in range(1, 9)]
    assert list(lab_check_modules()) == labs
    namespace = grader_namespace()
    assert sorted(k for k in namespace if k.startswith("lab") and k[3:].isdigit()) == labs
    for name in labs:
        assert namespace[name] is importlib.import_module(f"transformer_lab.checks.{name}")


def test_the_labs_in_solutions_and_the_kits_lab_tables_are_the_specs_labs() -> None:
    """``solutions/`` (what ``list_labs`` and the tests enumerate) holds exactly the labs with a
    spec, and the kit's per-lab tables name only those."""
    from transformer_lab.grading.course import list_labs
    from transformer_lab.lab import CPU_LABS

    labs = [s.lab for s in all_specs()]
    assert list_labs(REPO) == labs
    assert set(CPU_LABS) <= set(labs), sorted(set(CPU_LABS) - set(labs))


def test_every_answer_is_a_part_of_its_labs_spec_with_the_specs_kit() -> None:
    specs = {spec.lab: spec for spec in all_specs()}
    for answer in ANSWERS:
        assert answer.lab in specs, f"{answer.name}: no spec for lab {answer.lab!r}"
        spec = specs[answer.lab]
        module, _, _ = answer.check.partition(".")
        assert module == f"lab{answer.lab[:2]}", f"{answer.name}: {answer.check} of another lab"
        assert callable(answer.check_function()), f"{answer.check} is not a check"
        kits = {k for part in spec.parts.values() for k in part.kit}
        if answer.asked:
            assert answer.name in spec.parts, f"{answer.name} is no part of {answer.lab}'s spec"
            if answer.kit:
                assert answer.kit in spec.parts[answer.name].kit, (answer.name, answer.kit)
        else:  # a kit piece graded through another answer: one of that lab's kit answers
            assert answer.kit in kits, f"{answer.kit} is no kit answer of {answer.lab}'s spec"


def test_every_stand_in_replaces_a_kit_answer_a_spec_declares() -> None:
    kits = {k for spec in all_specs() for part in spec.parts.values() for k in part.kit}
    assert set(STAND_INS) <= kits, sorted(set(STAND_INS) - kits)
    stand_ins = {
        s for spec in all_specs() for p in spec.parts.values() for s in p.builds_on.values()
    }
    import transformer_lab.standins as module

    assert all(callable(getattr(module, name, None)) for name in stand_ins), sorted(stand_ins)


# -- a lab 09, scaffolded in a copy of the repository --------------------------------------------

KIT_ANSWER = '''"""Lab 09's kit answer (a test's scaffolded lab)."""

import torch

from transformer_lab.graded import graded


@graded("09_example")
def example(x: torch.Tensor) -> torch.Tensor:
    """Twice x."""
    return 2 * x
'''

#: Run in the copy: judge lab 09's visible and hidden cells for a correct notebook and for one
#: that reassigns its visible check (in-process kernel: ``judge_support.InProcessKernel``).
JUDGE_SCRIPT = r"""
import json, sys, types
import nbformat, pytest
from judge_support import InProcessKernel
from transformer_lab.checks.spec import lint_spec, load
from transformer_lab.grading import judge

nb = nbformat.read(sys.argv[1], as_version=4)
cells = {c.metadata.get("nbgrader", {}).get("grade_id"): c.source for c in nb.cells}
out = {"judge": judge.__file__, "labs": list(judge.lab_check_modules()),
       "lint": lint_spec(load("09_example"), nb, "09_example")}

def run(kernel_names, grade_id, hidden=False):
    with pytest.MonkeyPatch.context() as mp:
        link = InProcessKernel(mp, kernel_names)
        session = judge.JudgeSession(link, timeout=30, hidden=hidden)
        verdict = judge.judge_cell(grade_id, cells[grade_id], session)
        return {"passed": verdict.passed, "message": verdict.message,
                "asked_for_lab09": any('"lab09"' in text for text in link.texts)}

def twice(x):
    return 2 * x

def wrong(x):
    return x

# What a notebook's `lab09.check_example = lambda *a: None` leaves in its kernel (a stand-in
# module here: the in-process kernel shares this process's real one with the grader).
forged = types.SimpleNamespace(check_example=lambda *a: None)
out["correct"] = run({"example": twice}, "test_example_visible")
out["correct_hidden"] = run({"example": twice}, "test_example_hidden", hidden=True)
out["wrong"] = run({"example": wrong}, "test_example_visible")
out["forged"] = run({"example": wrong, "lab09": forged}, "test_example_visible")
print(json.dumps(out))
"""


def _copy_of_the_repository(root: Path) -> Path:
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "transformer_lab", root / "transformer_lab", ignore=skip)
    shutil.copy(REPO / "nbgrader_config.py", root / "nbgrader_config.py")
    (root / "solutions").mkdir()
    return root


def _in_copy(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(REPO / "tests")])}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(
        [sys.executable, *args], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )


def _lab_09(root: Path) -> Path:
    """A copy of the repository at ``root`` holding lab 09, made as an author makes one:
    ``labs new``, then the kit's answer declared in the spec with the ban that refuses it."""
    _copy_of_the_repository(root)
    new = _in_copy(
        root, "-m", "transformer_lab.cli", "labs", "new", "09_example", "--title", "Example"
    )
    assert new.returncode == 0, new.stderr
    assert "wrote transformer_lab/checks/specs/lab09.toml" in new.stdout
    (root / "transformer_lab" / "example.py").write_text(KIT_ANSWER)
    spec = root / "transformer_lab" / "checks" / "specs" / "lab09.toml"
    text = spec.read_text().replace(
        'reason = "lab 09', 'functions = ["transformer_lab.example"]\nreason = "lab 09'
    )
    text = text.replace(
        '\nbans = ["own"]\n', '\nbans = ["own"]\nkit = ["transformer_lab.example.example"]\n'
    )
    spec.write_text(text)
    return root


def test_a_lab_09_made_with_labs_new_is_judged_in_the_grader(tmp_path: Path) -> None:
    root = _lab_09(tmp_path / "repo")
    notebook = root / "solutions" / "09_example" / "09_example.ipynb"
    (root / "judge_lab09.py").write_text(JUDGE_SCRIPT)
    ran = _in_copy(root, "judge_lab09.py", str(notebook))
    assert ran.returncode == 0, ran.stderr[-3000:]
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    assert Path(out["judge"]).is_relative_to(root)  # the copy's kit, not the repository's
    assert out["labs"][-1] == "lab09" and "lab09" not in [n for n in out["labs"][:-1]]
    assert out["lint"] == []
    assert out["correct"] == {"passed": True, "message": "", "asked_for_lab09": False}
    assert out["correct_hidden"]["passed"], out["correct_hidden"]
    for case in ("wrong", "forged"):
        verdict = out[case]
        assert not verdict["passed"] and not verdict["asked_for_lab09"], (case, verdict)
        assert "example([1, 2])" in verdict["message"], (case, verdict)
    assert out["forged"] == out["wrong"]


def _submission(root: Path, course: Path, student: str, forged: bool) -> None:
    nb = nbformat.read(str(root / "solutions" / "09_example" / "09_example.ipynb"), as_version=4)
    if forged:  # a wrong answer, and the visible check replaced by one that passes anything
        (answer,) = [
            c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "example"
        ]
        answer.source = answer.source.replace("return 2 * x", "return x")
        nb.cells.insert(2, nbformat.v4.new_code_cell("lab09.check_example = lambda *a: None"))
    folder = course / "submitted" / student / "09_example"
    folder.mkdir(parents=True)
    nbformat.write(nb, str(folder / "09_example.ipynb"))


@pytest.mark.slow
def test_labs_grade_judges_lab_09_and_a_reassigned_check_earns_nothing(tmp_path: Path) -> None:
    """The round trip: ``labs build 09`` and ``labs grade`` in the copy, in the sandbox where
    the tests require it; the visible cell's verdict is the grader's check's own message."""
    from conftest import GRADING_SANDBOX

    root = _lab_09(tmp_path / "repo")
    built = _in_copy(root, "-m", "transformer_lab.cli", "labs", "build", "09", "--no-student")
    assert built.returncode == 0, built.stderr[-3000:]
    course = tmp_path / "course"
    _submission(root, course, "honest", forged=False)
    _submission(root, course, "forged", forged=True)
    sandbox = ["--sandbox", "required"] if GRADING_SANDBOX == "required" else ["--unsandboxed"]
    graded = _in_copy(
        root, "-m", "transformer_lab.cli", "labs", "grade", "--course", str(course),
        "--jobs", "1", "--timeout", "60", *sandbox,
    )  # fmt: skip
    assert graded.returncode == 1, graded.stderr[-3000:]  # 1: a submission is flagged
    report = json.loads((course / "grading_report.json").read_text())
    results = {r["student"]: r for r in report["runs"][-1]["results"]}
    assert results["honest"]["cell_scores"] == {
        "test_example_visible": [1.0, 1.0],
        "test_example_hidden": [1.0, 1.0],
    }
    forged = results["forged"]
    assert forged["auto_score"] == 0.0
    visible = forged["verdicts"]["test_example_visible"]
    assert visible["score"] == 0.0
    assert visible["message"].startswith("example([1, 2]) is wrong at 2 of 2 entries")
    assert "expected 4" in visible["message"] and visible["message"].endswith("Multiply by two.")
    assert forged["status"] == "flagged" and results["honest"]["status"] == "graded"
    assert any("changes lab09.check_example" in flag for flag in forged["flags"])


@pytest.mark.parametrize("bad", ["9_example", "09-Example"])
def test_labs_new_names_a_bad_lab_name(tmp_path: Path, bad: str) -> None:
    root = _copy_of_the_repository(tmp_path / "repo")
    new = _in_copy(root, "-m", "transformer_lab.cli", "labs", "new", bad, "--title", "X")
    assert new.returncode != 0
    assert repr(bad) in new.stderr + new.stdout
    assert not (root / "transformer_lab" / "checks" / "specs" / "lab09.toml").exists()


# -- a mistake is a record: lab 05's upper-triangular causal mask ------------------------------

UPPER = "causal causal_upper"


def _upper_disagreements(record: Any) -> list[str]:
    """Where the hidden check, the stored fixtures and the catalogue's test disagree with the
    spec's record of lab 05's upper-triangular causal mask (one line each)."""
    import test_lab05_checks as t05

    from transformer_lab.checks._common import stored_data
    from transformer_lab.grading.hidden import lab05 as hidden05

    wrong = record.wrong_answer()
    problems = []
    for i, T in enumerate((4, 1, 7)):  # the stored examples (T = 1: the mistake is right)
        mistakes = hidden05.causal_mistakes(T)
        _, stored = stored_data("lab05", f"check_causal_mask {i}")
        if T > 1 and not torch.equal(mistakes.get(record.hint, torch.empty(0)), wrong(T)):
            problems.append(f"the hidden check's causal_mistakes({T}) has no {record.hint!r}")
        if T > 1 and stored.get(record.hint) != wrong(T).tolist():
            problems.append(f"fixtures/lab05.json's causal_mask({T}) has no {record.hint!r}")
    named = {fn.__name__: words for fn, words in t05.CAUSAL_MISTAKES}
    if named.get(wrong.__name__) is None or named[wrong.__name__] not in record.hint:
        problems.append(f"test_lab05_checks.CAUSAL_MISTAKES does not run {wrong.__name__}")
    else:
        fn = next(fn for fn, _ in t05.CAUSAL_MISTAKES if fn.__name__ == wrong.__name__)
        if not torch.equal(fn(5), wrong(5)):
            problems.append(f"test_lab05_checks' {wrong.__name__} is not the spec's wrong code")
    return problems


def test_lab05s_upper_triangular_mask_is_declared_once_in_its_spec() -> None:
    lab05 = spec.load("05_masking")
    record = lab05.mistake(UPPER)
    assert record.cells == ("test_causal_mask", "test_causal_mask_hidden")
    assert lab05.parts["causal_mask"].mistakes[UPPER] == record.cells  # what the costs read
    assert record.hint.startswith("Your mask is upper-triangular: ")
    assert _upper_disagreements(record) == []


def test_a_record_the_others_disagree_with_is_named() -> None:
    record = spec.load("05_masking").mistake(UPPER)
    reworded = dataclasses.replace(record, hint="Your mask is upside down.")
    assert _upper_disagreements(reworded) == [
        "the hidden check's causal_mistakes(4) has no 'Your mask is upside down.'",
        "fixtures/lab05.json's causal_mask(4) has no 'Your mask is upside down.'",
        "the hidden check's causal_mistakes(7) has no 'Your mask is upside down.'",
        "fixtures/lab05.json's causal_mask(7) has no 'Your mask is upside down.'",
        "test_lab05_checks.CAUSAL_MISTAKES does not run causal_upper",
    ]
    other_code = dataclasses.replace(
        record, wrong="def causal_upper(T):\n    return torch.ones(T, T)\n"
    )
    assert "test_lab05_checks' causal_upper is not the spec's wrong code" in _upper_disagreements(
        other_code
    )


def test_a_bad_mistake_record_is_named() -> None:
    bad = '[parts.a.mistakes."a a_wrong"]\ncells = ["t"]\nhints = "x"\n'
    with pytest.raises(spec.SpecError, match=r"parts\.a\.mistakes\.'a a_wrong' holds cells"):
        spec.parse(f'lab = "09_x"\n{bad}', "lab09.toml")
    with pytest.raises(spec.SpecError, match="no mistake record 'a a_nope'"):
        spec.parse('lab = "09_x"\n[parts.a]\n', "lab09.toml").mistake("a a_nope")


def test_docs_labs_shows_the_course_code_table_of_the_tree() -> None:
    from transformer_lab.grading.course import list_labs
    from transformer_lab.grading.standard import course_code_table

    table = course_code_table(REPO, list_labs(REPO))
    assert table.splitlines()[-1].startswith("| all | ")
    docs = (REPO / "docs" / "labs.md").read_text()
    assert table in docs, "docs/labs.md: paste the table printed by\n" + table


def test_every_stored_example_belongs_to_a_part_of_its_labs_spec(tmp_path: Path) -> None:
    from transformer_lab.grading.fixtures import check_fixtures, unowned_keys

    for lab_spec in all_specs():
        stored = REPO / "transformer_lab" / "checks" / "fixtures" / f"lab{lab_spec.lab[:2]}.json"
        assert unowned_keys(lab_spec.lab, list(json.loads(stored.read_text()))) == []
    # a key left behind by a renamed part is named, with the file and the spec
    assert unowned_keys("07_nlp_pipeline", ["beam lecture: table", "check_beam_search_eos 0"]) == []
    assert unowned_keys("07_nlp_pipeline", ["beam_serch 0", "check_beams 1"]) == [
        "beam_serch 0",
        "check_beams 1",
    ]
    hidden = importlib.import_module("transformer_lab.grading.hidden.lab07")
    made = hidden.fixtures()
    renamed = {key.replace("check_top_k_filter", "check_top_k"): v for key, v in made.items()}
    fake = tmp_path / "transformer_lab" / "checks" / "fixtures"
    fake.mkdir(parents=True)
    (fake / "lab07.json").write_text(json.dumps(renamed))
    original = hidden.fixtures
    try:
        hidden.fixtures = lambda: renamed
        problems = check_fixtures(tmp_path, ["07_nlp_pipeline"])
    finally:
        hidden.fixtures = original
    n = sum("check_top_k " in key or "check_top_k:" in key for key in renamed)
    assert problems == [
        f"lab07.json: {n} stored key(s) belong to no part of specs/lab07.toml, e.g. "
        "'check_top_k: cases': begin each with its part's name"
    ]
