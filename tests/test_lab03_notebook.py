"""Lab 03's solution notebook: structure, and its answers against its own test cells.

The fast tests read the nbgrader source notebook, check its metadata (unique grade ids, the
points the introduction announces, hidden tests inside markers, no outputs) and run the
solution's answer cells through every test cell, hidden parts included, without nbgrader. The
end-to-end round trip (solution = full marks, untouched release = zero, grading profile) is the
pipeline's ``transformer-lab labs check``; :func:`test_lab03_round_trip` runs it (marked slow).
The shared logic lives in ``tests/notebook_support.py``.
"""

from __future__ import annotations

from typing import Any

import notebook_support as nbs
import pytest

from transformer_lab.checks import lab03

LAB = "03_multi_head_attention"

# Points per graded function, as the notebook's introduction states them.
EXPECTED_POINTS = {
    "split_heads": 3,
    "merge_heads": 2,
    "mha": 7,
    "load": 3,
    "written": 3,
}
ANSWERS = ("setup", "split_heads", "merge_heads", "MultiHeadAttention", "load_torch_weights")


@pytest.fixture(scope="module")
def notebook() -> Any:
    return nbs.read_source(LAB)


def test_metadata_ids_points_and_markers(notebook: Any) -> None:
    nbs.assert_metadata(notebook, EXPECTED_POINTS)
    nbs.assert_points_table(
        notebook, (("split_heads", 3), ("class MultiHeadAttention", 7), ("load_torch", 3))
    )


def test_first_code_cell_is_the_locked_setup(notebook: Any) -> None:
    nbs.assert_locked_setup_first(notebook)


def test_every_check_the_notebook_calls_exists(notebook: Any) -> None:
    nbs.assert_checks_exist_and_are_called(notebook, lab03)


def test_solution_passes_its_own_test_cells(notebook: Any) -> None:
    assert nbs.run_test_cells(notebook, ANSWERS) == 11


def test_release_is_generated_and_holds_no_solution() -> None:
    # A line of the model answer to load_torch_weights.
    nbs.assert_release_clean(LAB, "in_proj_weight.split(D)")


@pytest.mark.slow
def test_lab03_round_trip() -> None:
    """Solution full marks, untouched release zero, through nbgrader in the grading profile."""
    nbs.assert_round_trip(LAB)
