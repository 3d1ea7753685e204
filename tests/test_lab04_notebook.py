"""Lab 04's solution notebook: structure, and its answers against its own test cells.

The fast tests read the nbgrader source notebook, check its metadata (unique grade ids, points as
the intro announces, hidden tests inside markers, no outputs) and run the solution's answer cells
through every check their test cells call, without nbgrader and without training. The end-to-end
round trip (solution = full marks, release = zero, in the grading profile) is the pipeline's
``transformer-lab labs check``; :func:`test_lab04_round_trip` runs it for this lab (marked slow).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import nbformat
import pytest

from transformer_lab.checks import lab04

REPO = Path(__file__).resolve().parents[1]
LAB = "04_transformer_block"
SOURCE = REPO / "solutions" / LAB / f"{LAB}.ipynb"
RELEASE = REPO / "labs" / LAB / f"{LAB}.ipynb"

# Points per graded idea, as the notebook's introduction states them.
EXPECTED_POINTS = {
    "layer_norm": 6,
    "feed_forward": 4,
    "encoder_block": 8,
    "trained_encoder": 3,
    "written": 6,
}


@pytest.fixture(scope="module")
def notebook() -> Any:
    return nbformat.read(SOURCE, as_version=4)


def _meta(cell: Any) -> dict[str, Any]:
    return cell.metadata.get("nbgrader", {})


def _group(grade_id: str) -> str:
    for key in EXPECTED_POINTS:
        if key in grade_id:
            return key
    raise AssertionError(f"grade id {grade_id} belongs to no graded idea")


def test_metadata_ids_points_and_markers(notebook: Any) -> None:
    ids = [_meta(c)["grade_id"] for c in notebook.cells if _meta(c)]
    assert len(ids) == len(set(ids)), "grade ids must be unique"
    points: dict[str, int] = dict.fromkeys(EXPECTED_POINTS, 0)
    for cell in notebook.cells:
        meta = _meta(cell)
        assert cell.get("outputs", []) == [] and cell.get("execution_count") is None
        if meta.get("grade"):
            points[_group(meta["grade_id"])] += meta["points"]
        if cell.cell_type == "code" and meta.get("solution"):
            assert "### BEGIN SOLUTION" in cell.source and "### END SOLUTION" in cell.source
        if "hidden_check" in cell.source:
            assert meta.get("grade") and meta.get("locked")
            hidden = cell.source.split("### BEGIN HIDDEN TESTS")[1].split("### END HIDDEN TESTS")[0]
            assert "hidden_check" in hidden
            assert "hidden_check" not in cell.source.replace(hidden, "")
    assert points == EXPECTED_POINTS


def test_first_code_cell_is_the_locked_setup(notebook: Any) -> None:
    first = next(c for c in notebook.cells if c.cell_type == "code")
    assert _meta(first) == {**_meta(first), "grade_id": "setup", "locked": True}
    assert "KIT_SOURCE = " in first.source and "current_profile" in first.source


def test_every_check_the_notebook_calls_exists(notebook: Any) -> None:
    called = set(re.findall(r"lab04\.(\w+)", "\n".join(c.source for c in notebook.cells)))
    assert called, "the notebook calls no lab04 checks"
    assert sorted(n for n in called if not hasattr(lab04, n)) == []


def _run_cells(notebook: Any, grade_ids: set[str]) -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    for cell in notebook.cells:
        if cell.cell_type == "code" and _meta(cell).get("grade_id") in grade_ids:
            exec(compile(cell.source, _meta(cell)["grade_id"], "exec"), namespace)
    return namespace


def test_solution_passes_its_own_test_cells(notebook: Any) -> None:
    """Every block/layer-norm/feed-forward test cell, hidden parts included, passes the solution."""
    namespace = _run_cells(
        notebook, {"setup", "imports", "layer_norm", "feed_forward", "encoder_block"}
    )
    ran = 0
    for cell in notebook.cells:
        grade_id = _meta(cell).get("grade_id", "")
        if _meta(cell).get("grade") and cell.cell_type == "code" and "trained" not in grade_id:
            exec(compile(cell.source, grade_id, "exec"), dict(namespace))
            ran += 1
    assert ran == 10


def test_release_is_generated_and_holds_no_solution() -> None:
    if not RELEASE.exists():
        pytest.skip("labs/ not generated yet (transformer-lab labs build)")
    text = RELEASE.read_text()
    for leak in (
        "BEGIN SOLUTION",
        "BEGIN HIDDEN TESTS",
        "hidden_check",
        "Model answer",
        "torch.sqrt(var + eps)",
    ):
        assert leak not in text, leak


@pytest.mark.slow
def test_lab04_round_trip() -> None:
    """Solution full marks, untouched release zero, through nbgrader in the grading profile."""
    from transformer_lab.grading.check import check_labs

    assert check_labs(REPO, [LAB]) == []
