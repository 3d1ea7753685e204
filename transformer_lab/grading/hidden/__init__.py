"""Hidden checks: what the grader runs and students never receive (one module per lab).

``labNN.py`` holds the lab's ``hidden_check_<name>(fn, seed=...)`` functions, which the hidden
regions of the source notebook's test cells call, the independent oracles they compare with
(``oracle_*``), the catalogues of typical mistakes that name what a wrong answer did, and
``fixtures()``: the expected values of the visible checks' worked examples, which
``transformer-lab labs build`` stores in ``transformer_lab/checks/fixtures/labNN.json`` so that
the visible checks need no oracle.

The student package leaves this folder out (:mod:`transformer_lab.grading.student`); inside a
ban (:mod:`transformer_lab.judge.bans`) every function defined here is refused, so a
submission that reaches an oracle at grading time earns nothing from it.
"""

from typing import Any

from torch import Tensor

__all__ = ["fixture_entry"]


def fixture_entry(expected: Any, mistakes: dict[str, Any] | None = None) -> dict[str, Any]:
    """One stored worked example, as JSON data: ``{"expected": ..., "mistakes": {hint: ...}}``.

    Tensors become nested lists; anything else (token ids, beams, scores) is stored as it is.
    The mistakes keep their order, the catalogue's. Checks that name a mistake only when it
    matches on every example (:func:`~transformer_lab.checks._common.judge_cases`) store the
    mistakes that differ from the expected value: one left out gives the expected value there.
    """

    def plain(value: Any) -> Any:
        return value.tolist() if isinstance(value, Tensor) else value

    return {
        "expected": plain(expected),
        "mistakes": {hint: plain(value) for hint, value in (mistakes or {}).items()},
    }
