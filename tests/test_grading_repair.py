"""Metadata repair of Colab round trips (no kernel): matching by id, content and position."""

from __future__ import annotations

import copy
from pathlib import Path

import nbformat
import pytest

from transformer_lab.grading.repair import repair_notebook

REPO = Path(__file__).resolve().parents[1]
LAB = "01_positional_encoding"


@pytest.fixture(scope="module")
def release() -> nbformat.NotebookNode:
    return nbformat.read(str(REPO / "labs" / LAB / f"{LAB}.ipynb"), as_version=4)


def _graded(nb) -> dict[str, dict]:
    return {
        c.metadata.nbgrader["grade_id"]: dict(c.metadata.nbgrader)
        for c in nb.cells
        if "nbgrader" in c.metadata
    }


def _student_copy(release) -> nbformat.NotebookNode:
    """The release with a filled-in answer cell, as a student would hand it in."""
    nb = copy.deepcopy(release)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "sinusoidal_encoding":
            cell.source = cell.source.replace(
                "# YOUR CODE HERE\n    raise NotImplementedError()",
                "pos = torch.arange(seq_len)[:, None]\n    return pos.expand(seq_len, d_model)",
            )
    return nb


def _index(nb, grade_id: str) -> int:
    """Position of the cell whose nbgrader grade_id (or cell id) is ``grade_id``."""
    for i, cell in enumerate(nb.cells):
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id:
            return i
        if cell.get("id") == grade_id:
            return i
    raise KeyError(grade_id)


def _colab(nb, *, drop_nbgrader: bool) -> nbformat.NotebookNode:
    """What a Colab round trip may do: drop ids and nbgrader metadata, add its own keys."""
    nb = copy.deepcopy(nb)
    nb.nbformat_minor = 0
    for i, cell in enumerate(nb.cells):
        cell.pop("id", None)
        if drop_nbgrader:
            cell.metadata.pop("nbgrader", None)
            cell.metadata.pop("editable", None)
            cell.metadata.pop("deletable", None)
        cell.metadata["id"] = f"colab{i}"
        cell.metadata["colab"] = {"base_uri": "https://localhost:8080/"}
    nb.metadata["colab"] = {"provenance": []}
    return nb


def test_intact_submission_needs_no_repair(release) -> None:
    result = repair_notebook(_student_copy(release), release)
    assert result.ok and result.matched == result.expected
    assert result.actions == []
    assert _graded(result.notebook) == _graded(release)


def test_stripped_metadata_is_restored_exactly(release) -> None:
    student = _student_copy(release)
    result = repair_notebook(_colab(student, drop_nbgrader=True), release)
    assert result.ok and result.matched == result.expected
    assert _graded(result.notebook) == _graded(release)
    # The student's answer stayed in place, with the answer cell's metadata.
    answer = result.notebook.cells[_index(result.notebook, "sinusoidal_encoding")]
    assert "pos.expand" in answer.source
    wanted = "restored the lost metadata of answer cell 'sinusoidal_encoding'"
    assert any(wanted in a for a in result.actions)
    assert all("colab" not in c.metadata and "id" not in c.metadata for c in result.notebook.cells)
    nbformat.validate(result.notebook)


def test_extended_and_duplicated_metadata(release) -> None:
    student = _colab(_student_copy(release), drop_nbgrader=False)
    idx = _index(student, "sinusoidal_encoding")
    student.cells[idx].metadata.nbgrader["colab_extra"] = True  # extended
    student.cells[idx].metadata.nbgrader["points"] = 50  # tampered
    stub = copy.deepcopy(release.cells[idx])  # a copy of the untouched stub cell, pasted above
    student.cells.insert(idx, stub)
    result = repair_notebook(student, release)
    assert result.ok
    assert _graded(result.notebook) == _graded(release)
    ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in result.notebook.cells]
    assert ids.count("sinusoidal_encoding") == 1
    kept = result.notebook.cells[ids.index("sinusoidal_encoding")]
    assert "pos.expand" in kept.source  # the copy holding the student's work keeps the id
    text = "\n".join(result.actions)
    assert "appeared in 2 cells" in text and "extra keys ['colab_extra', 'points']" in text
    assert len({c.id for c in result.notebook.cells}) == len(result.notebook.cells)


def test_deleted_and_edited_test_cells_are_reported(release) -> None:
    student = _colab(_student_copy(release), drop_nbgrader=True)
    gids = list(_graded(release))
    shape_cell = _index(release, "test_sinusoidal_encoding_shape")
    values_cell = _index(release, "test_relative_shift_matrix_values")
    student.cells[shape_cell].source = "# I removed this check\npass"
    del student.cells[values_cell]
    result = repair_notebook(student, release)
    assert result.ok
    text = "\n".join(result.actions)
    assert "test cell 'test_relative_shift_matrix_values' is missing; nbgrader puts it back" in text
    assert "test cell 'test_sinusoidal_encoding_shape' was edited" in text
    assert set(_graded(result.notebook)) == set(gids) - {"test_relative_shift_matrix_values"}


def test_another_notebook_is_unmatched(release) -> None:
    cells = [nbformat.v4.new_markdown_cell("# My homework"), nbformat.v4.new_code_cell("print(1)")]
    other = nbformat.v4.new_notebook(cells=cells)
    result = repair_notebook(other, release)
    assert not result.ok and result.notebook is None
    assert "right lab" in result.reason
