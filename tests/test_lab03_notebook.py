"""Lab 03's solution notebook: structure, and its answers against its own test cells.

The fast tests read the nbgrader source notebook, check its metadata (unique grade ids, the
points the introduction announces, hidden tests inside markers, no outputs) and run the
solution's answer cells through every test cell, hidden parts included, without nbgrader. The
end-to-end round trip (solution = full marks, untouched release = zero, grading profile) is the
pipeline's ``transformer-lab labs check``; :func:`test_lab03_round_trip` runs it (marked slow).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import nbformat
import pytest

from transformer_lab.checks import lab03

REPO = Path(__file__).resolve().parents[1]
LAB = "03_multi_head_attention"
SOURCE = REPO / "solutions" / LAB / f"{LAB}.ipynb"
RELEASE = REPO / "labs" / LAB / f"{LAB}.ipynb"

# Points per graded function, as the notebook's introduction states them.
EXPECTED_POINTS = {
    "split_heads": 3,
    "merge_heads": 2,
    "mha": 7,
    "load": 3,
    "written": 3,
}
ANSWERS = ("split_heads", "merge_heads", "MultiHeadAttention", "load_torch_weights")


@pytest.fixture(scope="module")
def notebook() -> Any:
    return nbformat.read(SOURCE, as_version=4)


def _meta(cell: Any) -> dict[str, Any]:
    return cell.metadata.get("nbgrader", {})


def _group(grade_id: str) -> str:
    for key in EXPECTED_POINTS:
        if key in grade_id:
            return key
    raise AssertionError(f"grade id {grade_id} belongs to no graded function")


def test_metadata_ids_points_and_markers(notebook: Any) -> None:
    ids = [_meta(c)["grade_id"] for c in notebook.cells if _meta(c)]
    assert len(ids) == len(set(ids)), "grade ids must be unique"
    points = dict.fromkeys(EXPECTED_POINTS, 0)
    for cell in notebook.cells:
        meta = _meta(cell)
        assert cell.get("outputs", []) == [] and cell.get("execution_count") is None
        if meta.get("grade"):
            assert meta.get("locked") or cell.cell_type == "markdown"
            points[_group(meta["grade_id"])] += meta["points"]
        if cell.cell_type == "code" and meta.get("solution"):
            assert "### BEGIN SOLUTION" in cell.source and "### END SOLUTION" in cell.source
        if "hidden_check" in cell.source:
            hidden = cell.source.split("### BEGIN HIDDEN TESTS")[1].split("### END HIDDEN TESTS")[0]
            assert "hidden_check" not in cell.source.replace(hidden, "")
    assert points == EXPECTED_POINTS
    table = "\n".join(c.source for c in notebook.cells[:1])
    for name, pts in (("split_heads", 3), ("class MultiHeadAttention", 7), ("load_torch", 3)):
        assert re.search(rf"`{name}[^|]*\|\s*{pts}\s*\|", table), name


def test_first_code_cell_is_the_locked_setup(notebook: Any) -> None:
    first = next(c for c in notebook.cells if c.cell_type == "code")
    assert _meta(first)["grade_id"] == "setup" and _meta(first)["locked"]
    assert "KIT_SOURCE = " in first.source and "current_profile" in first.source


def test_every_check_the_notebook_calls_exists(notebook: Any) -> None:
    called = set(re.findall(r"lab03\.(\w+)", "\n".join(c.source for c in notebook.cells)))
    assert {n for n in called if not hasattr(lab03, n)} == set()
    public = {n for n in lab03.__all__ if n.startswith(("check_", "hidden_check_"))}
    assert public <= called, f"checks never called: {sorted(public - called)}"


def test_solution_passes_its_own_test_cells(notebook: Any) -> None:
    namespace: dict[str, Any] = {}
    for cell in notebook.cells:
        if cell.cell_type == "code" and _meta(cell).get("grade_id") in {"setup", *ANSWERS}:
            exec(compile(cell.source, _meta(cell)["grade_id"], "exec"), namespace)
    ran = 0
    for cell in notebook.cells:
        if _meta(cell).get("grade") and cell.cell_type == "code":
            exec(compile(cell.source, _meta(cell)["grade_id"], "exec"), dict(namespace))
            ran += 1
    assert ran == 11


def test_release_is_generated_and_holds_no_solution() -> None:
    if not RELEASE.exists():
        pytest.skip("labs/ not generated yet (transformer-lab labs build)")
    text = RELEASE.read_text()
    for leak in (
        "BEGIN SOLUTION",
        "BEGIN HIDDEN TESTS",
        "hidden_check",
        "Model answer",
        "amax(dim",
    ):
        assert leak not in text, leak


@pytest.mark.slow
def test_lab03_round_trip() -> None:
    """Solution full marks, untouched release zero, through nbgrader in the grading profile."""
    from transformer_lab.grading.check import check_labs

    assert check_labs(REPO, [LAB]) == []
