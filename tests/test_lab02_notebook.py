"""Lab 02's solution notebook: structure, and its answers against its own test cells.

The fast tests read the nbgrader source notebook, check its metadata (unique grade ids, the
points the introduction announces, hidden tests inside markers, no outputs) and run the
solution's answer cells through every test cell, hidden parts included, without nbgrader. The
end-to-end round trip (solution = full marks, untouched release = zero, grading profile) is the
pipeline's ``transformer-lab labs check``; :func:`test_lab02_round_trip` runs it (marked slow).
The shared logic lives in ``tests/notebook_support.py``.
"""

from __future__ import annotations

from typing import Any

import notebook_support as nbs
import pytest

from transformer_lab.checks import lab02

LAB = "02_self_attention"

# Points per graded function, as the notebook's introduction states them.
EXPECTED_POINTS = {
    "softmax": 3,
    "self_attention_loop": 4,
    "self_attention_matrix": 3,
    "sdpa": 8,
    "written": 5,
}
ANSWERS = (
    "setup",
    "softmax",
    "self_attention_loop",
    "self_attention_matrix",
    "scaled_dot_product_attention",
)


@pytest.fixture(scope="module")
def notebook() -> Any:
    return nbs.read_source(LAB)


def test_metadata_ids_points_and_markers(notebook: Any) -> None:
    nbs.assert_metadata(notebook, EXPECTED_POINTS)
    nbs.assert_points_table(
        notebook, (("softmax", 3), ("self_attention_loop", 4), ("scaled_dot_product", 8))
    )


def test_first_code_cell_is_the_locked_setup(notebook: Any) -> None:
    nbs.assert_locked_setup_first(notebook)


def test_every_check_the_notebook_calls_exists(notebook: Any) -> None:
    nbs.assert_checks_exist_and_are_called(notebook, lab02)


def test_solution_passes_its_own_test_cells(notebook: Any) -> None:
    assert nbs.run_test_cells(notebook, ANSWERS) == 13


def test_release_is_generated_and_holds_no_solution() -> None:
    nbs.assert_release_clean(LAB, "amax(dim")


@pytest.mark.slow
def test_lab02_round_trip() -> None:
    """Solution full marks, untouched release zero, through nbgrader in the grading profile."""
    nbs.assert_round_trip(LAB)
