"""The verdict step alone: a submission's points come from the judge's verdicts, nothing else.

:func:`~transformer_lab.grading.grade.decide` is what ``grade_one`` runs after the notebook:
nbgrader's own scores (what passed in the kernel) only say each cell's maximum.
"""

from __future__ import annotations

from transformer_lab.grading.grade import decide

# nbgrader said every cell passed in the kernel: that decides nothing.
KERNEL_SAYS_ALL_PASSED = {"a": [2.0, 2.0], "b": [3.0, 3.0], "c": [1.0, 1.0]}


def test_points_are_the_judges_verdicts() -> None:
    verdicts = {
        "a": {"passed": True, "message": ""},
        "b": {"passed": False, "message": "Your mask is inverted", "mistake": "inverted mask"},
    }
    d = decide(KERNEL_SAYS_ALL_PASSED, verdicts, [])
    assert d.cell_scores == {"a": [2.0, 2.0], "b": [0.0, 3.0], "c": [0.0, 1.0]}
    assert d.notes["b"] == "Your mask is inverted" and "not reached" in d.notes["c"]
    assert d.verdicts["b"]["mistake"] == "inverted mask"
    assert (d.auto_score, d.auto_max, d.raw_auto_score, d.status) == (2.0, 6.0, 2.0, "")


def test_a_malformed_verdict_earns_nothing() -> None:
    verdicts = {"a": {"passed": "yes"}, "b": [True], "c": {"passed": 1}}
    d = decide(KERNEL_SAYS_ALL_PASSED, verdicts, [])
    assert d.auto_score == 0.0


def test_a_flag_withholds_every_point_for_review() -> None:
    verdicts = {gid: {"passed": True} for gid in KERNEL_SAYS_ALL_PASSED}
    d = decide(KERNEL_SAYS_ALL_PASSED, verdicts, ["student code: uses gc", "student code: uses gc"])
    assert d.status == "flagged" and d.auto_score == 0.0 and d.raw_auto_score == 6.0
    assert d.flags == ["student code: uses gc"]


def test_a_dead_or_cut_run_keeps_the_points_judged_before() -> None:
    verdicts = {"a": {"passed": True}}
    assert decide(KERNEL_SAYS_ALL_PASSED, verdicts, [], died=True).status == "crashed"
    cut = decide(KERNEL_SAYS_ALL_PASSED, verdicts, [], timed_out=True)
    assert cut.status == "incomplete" and cut.auto_score == 2.0
