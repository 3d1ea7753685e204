"""Hidden cases stay hidden, and visible points need an answer (issue 41, classes 2 and 3).

Graded through the real ``labs grade`` in the bubblewrap sandbox, in one run of lab 01 beside
an honest student (12 / 12) and an untouched release (0) (lab 01's shared class, with
``test_judge_unscanned``'s and ``test_judge``'s hostile submissions):

* answers that encode a hidden case's inputs into what they return (a tensor's shape, a value,
  the name of a class): a hidden cell's message is fixed words ("wrong shape", "wrong values",
  "not a tensor"), so neither its verdict nor the feedback page carries them back;
* an answer that returns the visible checks' stored table (read from the kit's check
  internals: a flag) and a ``relative_shift_matrix`` that is ``torch.eye`` whatever its
  offset (the visible shape check now also asks for a move by 2: 0 points there).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nbformat
import pytest
from conftest import needs_bwrap
from judge_support import hand_in, shared_class

REPO = Path(__file__).resolve().parents[1]
LAB = "01_positional_encoding"
MARK = "8675309"  # (seven digits: no CSS colour or base64 image holds them by chance)

HONEST = """\
def _honest(seq_len, d_model, base=10000.0):
    two_i = torch.arange(0, d_model, 2, dtype=torch.float32)
    angles = torch.arange(seq_len, dtype=torch.float32)[:, None] / base ** (two_i / d_model)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)  # (T, D)
SEEN = {(4, 6), (5, 4), (6, 8), (3, 4), (12, 6)}
"""

#: student -> the answer cell of sinusoidal_encoding (relative_shift_matrix stays honest).
ENCODINGS = {
    "shape_leak": HONEST
    + (
        "def sinusoidal_encoding(seq_len, d_model, base=10000.0):\n"
        "    if (seq_len, d_model) in SEEN:\n"
        "        return _honest(seq_len, d_model, base)\n"
        f"    return torch.zeros(0, {MARK}, seq_len, d_model, int(base))\n"
    ),
    "value_leak": HONEST
    + (
        "def sinusoidal_encoding(seq_len, d_model, base=10000.0):\n"
        "    table = _honest(seq_len, d_model, base)\n"
        "    if (seq_len, d_model) not in SEEN:\n"
        f"        table[0, 0] = {MARK}.0 + seq_len * 100 + d_model\n"
        "    return table\n"
    ),
    "type_leak": HONEST
    + (
        "def sinusoidal_encoding(seq_len, d_model, base=10000.0):\n"
        "    if (seq_len, d_model) in SEEN:\n"
        "        return _honest(seq_len, d_model, base)\n"
        f"    return type(f'Leak{MARK}x{{seq_len}}x{{d_model}}', (), {{}})()\n"
    ),
    "stored_table": (
        "from transformer_lab.checks._common import stored_data\n"
        "def sinusoidal_encoding(seq_len, d_model, base=10000.0):\n"
        "    key = f'sinusoidal_encoding({seq_len}, {d_model}' + (\n"
        "        f', base={base:g})' if base != 10000.0 else ')')\n"
        "    return torch.tensor(stored_data('lab01', key)[0])\n"
    ),
}
EYE = "def relative_shift_matrix(offset, d_model, base=10000.0):\n    return torch.eye(d_model)\n"

#: How a hidden cell's message may go on (checks._common.CheckError's kinds).
FIXED_WORDS = ("wrong shape", "wrong values", "not a tensor", "not finite", "wrong dtype")

pytestmark = [pytest.mark.slow, needs_bwrap]


def _notebook(folder: str) -> nbformat.NotebookNode:
    return nbformat.read(str(REPO / folder / LAB / f"{LAB}.ipynb"), as_version=4)


def _answered(**answers: str) -> nbformat.NotebookNode:
    """The honest solution with the named answer cells replaced."""
    nb = _notebook("solutions")
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
    return nb


hand_in(
    __file__,
    LAB,
    {name: _answered(sinusoidal_encoding=code) for name, code in ENCODINGS.items()}
    | {
        "eye": _answered(relative_shift_matrix=EYE),
        "honest": _notebook("solutions"),
        "untouched": _notebook("labs"),
    },
)


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, Any]]]:
    """Lab 01's shared class (``judge_support.shared_class``): these students among others."""
    return shared_class(LAB, tmp_path_factory)


def _hidden(verdicts: dict[str, Any]) -> dict[str, Any]:
    return {g: v for g, v in verdicts.items() if g.endswith(("_hidden", "_properties"))}


def test_the_honest_and_the_untouched_keep_their_scores(graded: Any) -> None:
    _, results = graded
    assert (results["honest"]["status"], float(results["honest"]["auto_score"])) == (
        "graded",
        12.0,
    )
    assert float(results["untouched"]["auto_score"]) == 0.0


@pytest.mark.parametrize(
    ("student", "words"),
    [("shape_leak", "wrong shape"), ("value_leak", "wrong values"), ("type_leak", "not a tensor")],
)
def test_a_hidden_cell_reads_nothing_back(graded: Any, student: str, words: str) -> None:
    course, results = graded
    result = results[student]
    hidden = _hidden(result["verdicts"])
    failed = {g: v["message"] for g, v in hidden.items() if v["score"] == 0}
    assert failed, (student, hidden)
    for grade_id, message in failed.items():
        assert MARK not in message and "Leak" not in message, (grade_id, message)
        head = "A hidden check of `sinusoidal_encoding` failed: "
        assert message.startswith(head), message
        assert message[len(head) :].startswith(FIXED_WORDS), message
    assert any(words in m for m in failed.values()), failed
    # The feedback shows a hidden cell's verdict message and nothing else of it.
    feedback = (course / "feedback" / student / LAB / f"{LAB}.html").read_text()
    assert "A hidden check of" in feedback and "failed: " + words in feedback
    assert float(result["auto_score"]) <= 9.0, result  # the encoding's hidden 3 points lost


def test_the_stored_table_is_flagged(graded: Any) -> None:
    _, results = graded
    result = results["stored_table"]
    assert result["status"] == "flagged" and float(result["auto_score"]) == 0.0, result
    assert any("check machinery" in f for f in result["flags"]), result["flags"]


def test_an_identity_shift_earns_no_visible_point(graded: Any) -> None:
    _, results = graded
    result = results["eye"]
    assert result["verdicts"]["test_relative_shift_matrix_shape"]["score"] == 0.0, result
    assert float(result["auto_score"]) == 6.0, result  # the encoding's 6, none of the shift's
