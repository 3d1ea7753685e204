"""A fresh clone on another machine: stored examples mean the same, and a rebuild changes nothing.

Another CPU, BLAS, thread count or torch build computes the oracles' floats with other last bits.
Each test here stands in for such a machine (two threads instead of one, a lower float32 matmul
precision, every oracle output nudged by one ulp) and regenerates every lab's stored examples into
a copy of them: ``labs check``'s fixture check must still pass and ``labs build``'s writer must
leave every file byte-identical. One perturbation larger than any rounding must be caught, so the
comparison can fail.
"""

from __future__ import annotations

import importlib
import json
import math
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from transformer_lab.grading.fixtures import (
    canonical,
    check_fixtures,
    first_difference,
    fixture_text,
    write_fixtures,
)

REPO = Path(__file__).resolve().parents[1]
LABS = sorted(p.name for p in (REPO / "solutions").iterdir() if p.name[:2].isdigit())


def _nudge(value: Any, step: Callable[[float], float]) -> Any:
    if isinstance(value, float):
        return step(value) if math.isfinite(value) else value
    if isinstance(value, dict):
        return {key: _nudge(item, step) for key, item in value.items()}
    if isinstance(value, list):
        return [_nudge(item, step) for item in value]
    return value


def _one_ulp(x: float) -> float:
    return math.nextafter(x, math.inf)


@pytest.fixture
def copy_of_the_fixtures(tmp_path: Path) -> Iterator[Path]:
    """A repository-shaped folder holding a copy of the committed stored examples."""
    target = tmp_path / "transformer_lab" / "checks" / "fixtures"
    shutil.copytree(REPO / "transformer_lab" / "checks" / "fixtures", target)
    yield tmp_path


def _perturb_oracles(monkeypatch: pytest.MonkeyPatch, step: Callable[[float], float]) -> None:
    for lab in LABS:
        hidden = importlib.import_module(f"transformer_lab.grading.hidden.lab{lab[:2]}")
        original = hidden.fixtures
        monkeypatch.setattr(hidden, "fixtures", lambda original=original: _nudge(original(), step))


def _assert_rebuild_changes_nothing(repo: Path) -> None:
    before = {p.name: p.read_bytes() for p in (repo / "transformer_lab/checks/fixtures").iterdir()}
    assert check_fixtures(repo, LABS) == []
    assert write_fixtures(repo, LABS) == []
    after = {p.name: p.read_bytes() for p in (repo / "transformer_lab/checks/fixtures").iterdir()}
    assert after == before


def test_the_committed_examples_are_canonical() -> None:
    """Written in the canonical rounding: what a rebuild here would write, to the byte."""
    for lab in LABS:
        stored = (REPO / "transformer_lab/checks/fixtures" / f"lab{lab[:2]}.json").read_text()
        data = json.loads(stored)
        assert json.dumps(canonical(data), indent=1) + "\n" == stored, lab
        assert first_difference(data, json.loads(fixture_text(lab) or "null")) is None, lab


def test_a_last_ulp_difference_in_every_oracle_changes_nothing(
    copy_of_the_fixtures: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _perturb_oracles(monkeypatch, _one_ulp)
    _assert_rebuild_changes_nothing(copy_of_the_fixtures)


def test_other_thread_counts_and_matmul_precision_change_nothing(
    copy_of_the_fixtures: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads, precision = torch.get_num_threads(), torch.get_float32_matmul_precision()
    try:
        torch.set_num_threads(2)
        torch.set_float32_matmul_precision("medium")
        _perturb_oracles(monkeypatch, lambda x: x * (1 + 3e-8))  # float32 rounding noise
        _assert_rebuild_changes_nothing(copy_of_the_fixtures)
    finally:
        torch.set_num_threads(threads)
        torch.set_float32_matmul_precision(precision)


def test_a_real_change_is_caught_and_rewritten(
    copy_of_the_fixtures: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _perturb_oracles(monkeypatch, lambda x: x + 1e-3)
    problems = check_fixtures(copy_of_the_fixtures, LABS)
    assert len(problems) == len(LABS)
    assert "lab01.json is out of date" in problems[0] and "!=" in problems[0]
    assert len(write_fixtures(copy_of_the_fixtures, LABS)) == len(LABS)
    monkeypatch.undo()
    assert len(check_fixtures(copy_of_the_fixtures, LABS)) == len(LABS)  # now the copy is off


@pytest.mark.parametrize(
    ("stored", "computed", "same"),
    [
        (0.48718767500700594, 0.4871876750070059, True),
        ([1, 2], [1, 2], True),
        ([1, 2], [1.0, 2.0], False),  # token ids stay integers
        ([True, False], [True, True], False),  # masks compare exactly
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}, False),  # the first matching mistake is named
        (float("nan"), float("nan"), True),
        (float("inf"), float("inf"), True),
        (float("-inf"), float("inf"), False),
        (1.0, 1.0 + 1e-4, False),
        ("sin and cos", "sin and cos", True),
    ],
)
def test_first_difference(stored: Any, computed: Any, same: bool) -> None:
    assert (first_difference(stored, computed) is None) is same


def test_canonical_rounding() -> None:
    assert canonical(0.48718767500700594) == canonical(0.4871876750070059) == 0.487187675
    assert canonical(-1e-300 * 1e-300) == 0.0 and math.copysign(1, canonical(-0.0)) == 1
    assert canonical({"x": [1, 2.0, float("inf")]}) == {"x": [1, 2.0, float("inf")]}


def test_a_failed_value_check_names_the_dtype_and_device() -> None:
    from transformer_lab.checks._common import expect_close

    with pytest.raises(AssertionError, match=r"\(float32 on cpu\)"):
        expect_close(torch.zeros(3), torch.ones(3, dtype=torch.float64), "your table")
