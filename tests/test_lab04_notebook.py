"""Lab 04's solution notebook: structure, and its answers against its own test cells.

The fast tests read the nbgrader source notebook, check its metadata (unique grade ids, points as
the intro announces, hidden tests inside markers, no outputs) and run the solution's answer cells
through every check their test cells call, without nbgrader and without training. The end-to-end
round trip (solution = full marks, release = zero, in the grading profile) is the pipeline's
``transformer-lab labs check``; :func:`test_lab04_round_trip` runs it for this lab (marked slow).
The shared logic lives in ``tests/notebook_support.py``.
"""

from __future__ import annotations

from typing import Any

import notebook_support as nbs
import pytest

from transformer_lab.checks import lab04

LAB = "04_transformer_block"

# Points per graded idea, as the notebook's introduction states them.
EXPECTED_POINTS = {
    "layer_norm": 6,
    "feed_forward": 4,
    "encoder_block": 8,
    "trained_encoder": 3,
    "written": 6,
}
ANSWERS = ("setup", "imports", "layer_norm", "feed_forward", "encoder_block")


@pytest.fixture(scope="module")
def notebook() -> Any:
    return nbs.read_source(LAB)


def test_metadata_ids_points_and_markers(notebook: Any) -> None:
    nbs.assert_metadata(notebook, EXPECTED_POINTS)
    nbs.assert_points_table(
        notebook, (("layer_norm", 6), ("class FeedForward", 4), ("class EncoderBlock", 8))
    )


def test_first_code_cell_is_the_locked_setup(notebook: Any) -> None:
    nbs.assert_locked_setup_first(notebook)


def test_every_check_the_notebook_calls_exists(notebook: Any) -> None:
    nbs.assert_checks_exist_and_are_called(notebook, lab04)


def test_solution_passes_its_own_test_cells(notebook: Any) -> None:
    """Every block/layer-norm/feed-forward test cell, hidden parts included, passes the solution."""
    assert nbs.run_test_cells(notebook, ANSWERS, skip="trained") == 10


def test_release_is_generated_and_holds_no_solution() -> None:
    nbs.assert_release_clean(LAB, "torch.sqrt(var + eps)")


@pytest.mark.slow
def test_lab04_round_trip() -> None:
    """Solution full marks, untouched release zero, through nbgrader in the grading profile."""
    nbs.assert_round_trip(LAB)
