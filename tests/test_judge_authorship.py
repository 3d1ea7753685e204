"""Whether the student wrote it, decided on the grader's side (issue 41, class 1).

The kernel's ban (a ``TorchFunctionMode`` and a profiler) is the student's to switch off: a
thread or TorchScript runs outside it, ``torch._C.DisableTorchFunction`` under another name
switches it off, the kit's ``exempt`` is importable there, ``torch.special.softmax`` is one more
spelling. Here lab 02's softmax is written with PyTorch's own in each of those ways, and
:mod:`transformer_lab.grading.authorship` reads the notebook in the grader: every one is refused
(its part's cells fail with "The grader read your code") or flagged for review, an honest
student's scratch comparison with ``torch.softmax`` is neither, and the honest solution and the
untouched release of every lab raise nothing. The slow test replays the attacks through the
real ``labs grade`` in the bubblewrap sandbox, in one run beside the honest and the untouched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nbformat
import pytest
from conftest import needs_bwrap
from judge_support import grade_class

from transformer_lab.checks.spec import all_specs, load, parts_of
from transformer_lab.grading.authorship import python_cells, refused_parts
from transformer_lab.grading.integrity import scan_student_code
from transformer_lab.grading.unreadable import review_flags

REPO = Path(__file__).resolve().parents[1]
LAB = "02_self_attention"
HONEST_SOFTMAX = """\
def softmax(x, dim=-1):
    e = (x - x.amax(dim, keepdim=True)).exp()
    return e / e.sum(dim, keepdim=True)
"""

#: Attacks the grader refuses: PyTorch's softmax under another spelling (no flag needed).
REFUSED = {
    "special": "def softmax(x, dim=-1):\n    return torch.special.softmax(x, dim)\n",
    "functional_alias": (
        "import torch.nn.functional as G\n"
        "def softmax(x, dim=-1):\n    return G.softmax(x, dim=dim)\n"
    ),
    "tensor_method": "def softmax(x, dim=-1):\n    return x.softmax(dim)\n",
    "getattr_name": "def softmax(x, dim=-1):\n    return getattr(torch, 'softmax')(x, dim)\n",
    "module_class": "def softmax(x, dim=-1):\n    return torch.nn.Softmax(dim)(x)\n",
    "stored_elsewhere": (
        "TOOLS = {}\nTOOLS['f'] = torch.special.softmax\n"
        "def softmax(x, dim=-1):\n    return TOOLS['f'](x, dim)\n"
    ),
    "global_from_a_function": (
        "def prepare():\n    global sm_\n    sm_ = torch.softmax\nprepare()\n"
        "def softmax(x, dim=-1):\n    return sm_(x, dim)\n"
    ),
    "star_import": (
        "from torch.nn.functional import *\n"
        "def softmax(x, dim=-1):\n    return log_softmax(x, dim).exp()\n"
    ),
    "dunder_call": "def softmax(x, dim=-1):\n    return torch.softmax.__call__(x, dim)\n",
    "kit_by_name": (
        "def softmax(x, dim=-1):\n"
        "    return lab.yours_or_kit(None, kit='transformer_lab.attention.softmax')(x, dim)\n"
    ),
    "timeit_magic": (
        "%timeit -n1 -r1 sm_ = torch.softmax\ndef softmax(x, dim=-1):\n    return sm_(x, dim)\n"
    ),
}

#: Attacks the grader cannot resolve statically: flagged for review (and the words it says).
FLAGGED = {
    "computed_getattr": (
        "def softmax(x, dim=-1):\n    return getattr(torch, 'soft' + 'max')(x, dim)\n",
        "reads attributes by a computed name (getattr)",
    ),
    "torchscript": (
        "@torch.jit.script\ndef soft_(x, dim: int):\n    return torch.softmax(x, dim)\n"
        "def softmax(x, dim=-1):\n    return soft_(x, dim)\n",
        "TorchScript",
    ),
    "thread": (
        "import threading\n"
        "def softmax(x, dim=-1):\n"
        "    out = {}\n"
        "    t = threading.Thread(target=lambda: out.update(v=torch.softmax(x, dim)))\n"
        "    t.start()\n    t.join()\n    return out['v']\n",
        "imports threading",
    ),
    "magic_hides_switch": (
        "x = %pwd\nfrom torch._C import DisableTorchFunction as Quiet\n"
        "def softmax(x, dim=-1):\n    with Quiet():\n        return torch.softmax(x, dim)\n",
        "torch's private internals (torch._C",
    ),
    "pop_mode": (
        "from torch.overrides import _pop_mode_temporarily as calm\n"
        "def softmax(x, dim=-1):\n    with calm():\n        return torch.softmax(x, dim)\n",
        "torch.overrides",
    ),
    "exempt": (
        "from transformer_lab.judge.bans import exempt as trust\n"
        "def softmax(x, dim=-1):\n    return torch.softmax(x, dim)\ntrust(softmax)\n",
        "the kit's check machinery",
    ),
    "exec": (
        "exec('def softmax(x, dim=-1):\\n    return torch.softmax(x, dim)')\n",
        "runs code from a string (exec)",
    ),
    "unreadable_magic": ("%run -i elsewhere.py\n" + HONEST_SOFTMAX, "runs the magic %run"),
    "written_module": (
        "%%writefile mine.py\nimport torch\nsoftmax = torch.softmax\n",
        "runs the magic %writefile",
    ),
    "own_module": (
        "from mine import softmax\n",
        "imports mine, a module the grader does not have",
    ),
}


def _notebook(folder: str, lab: str = LAB) -> nbformat.NotebookNode:
    return nbformat.read(str(REPO / folder / lab / f"{lab}.ipynb"), as_version=4)


def _with_softmax(code: str) -> nbformat.NotebookNode:
    """The honest solution with its softmax answer cell replaced by ``code``."""
    nb = _notebook("solutions")
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "softmax")
    cell.source = code
    return nb


def _softmax_cells() -> list[str]:
    return list(parts_of(_notebook("solutions"))["softmax"])


@pytest.mark.parametrize("name", list(REFUSED))
def test_pytorchs_softmax_under_any_spelling_is_refused(name: str) -> None:
    nb = _with_softmax(REFUSED[name])
    refused = refused_parts(nb, load(LAB), _notebook("solutions"))
    for cell in _softmax_cells():
        assert cell in refused, (name, sorted(refused))
        assert "The grader read your code" in refused[cell]
        assert "does not allow" in refused[cell] and "your own softmax" in refused[cell]
    assert "something" in refused["test_softmax_hidden"]  # a hidden cell names nothing of theirs
    assert scan_student_code(nb) == [], name  # refused, not flagged: nothing was unreadable


@pytest.mark.parametrize("name", list(FLAGGED))
def test_what_the_grader_cannot_read_is_flagged(name: str) -> None:
    code, words = FLAGGED[name]
    flags = "\n".join(scan_student_code(_with_softmax(code)))
    assert words in flags, (name, flags)


def test_an_honest_comparison_with_torch_is_neither_refused_nor_flagged() -> None:
    nb = _with_softmax(
        HONEST_SOFTMAX + "x = torch.randn(3, 4)\n"
        "print(torch.allclose(softmax(x), torch.softmax(x, -1)), x.softmax(-1).sum())\n"
    )
    assert refused_parts(nb, load(LAB), _notebook("solutions")) == {}
    assert scan_student_code(nb) == []


@pytest.mark.parametrize("spec", all_specs(), ids=lambda s: s.lab)
def test_every_labs_honest_and_untouched_notebooks_raise_nothing(spec: Any) -> None:
    source = _notebook("solutions", spec.lab)
    for nb in (source, _notebook("labs", spec.lab)):
        assert refused_parts(nb, spec, source) == {}
        assert review_flags(python_cells(nb)) == []


# ------------------------------------------------------------- through the real grader

#: The replays graded in the sandbox: student -> (softmax cell, what it must come to). (The
#: other attacks above are decided by the same code from the same notebook: CI's time is
#: spent on one of each way past the kernel's ban.)
REPLAYED = {
    "special": (REFUSED["special"], "refused"),
    "tensor_method": (REFUSED["tensor_method"], "refused"),
    "torchscript": (FLAGGED["torchscript"][0], "flagged"),
    "thread": (FLAGGED["thread"][0], "flagged"),
    "magic_hides_switch": (FLAGGED["magic_hides_switch"][0], "flagged"),
    "exempt": (FLAGGED["exempt"][0], "flagged"),
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """One sandboxed ``labs grade`` run of lab 02: every replay, the honest, the untouched."""
    course = tmp_path_factory.mktemp("authorship") / "course"
    notebooks = {name: _with_softmax(code) for name, (code, _) in REPLAYED.items()}
    notebooks |= {"honest": _notebook("solutions"), "untouched": _notebook("labs")}
    return grade_class(course, LAB, notebooks, budget=300)


@pytest.mark.slow
@needs_bwrap
def test_the_sandboxed_grader_refuses_or_flags_every_replay(graded: Any) -> None:
    honest, untouched = graded["honest"], graded["untouched"]
    assert (honest["status"], float(honest["auto_score"])) == ("graded", 18.0), honest
    assert (untouched["status"], float(untouched["auto_score"])) == ("graded", 0.0), untouched
    for student, (_, outcome) in REPLAYED.items():
        result = graded[student]
        if outcome == "flagged":
            assert result["status"] == "flagged" and result["flags"], (student, result)
            assert float(result["auto_score"]) == 0.0, student
            continue
        assert result["status"] == "graded", (student, result["flags"])
        for cell in _softmax_cells():  # the kernel's ban saw nothing; the grader did
            verdict = result["verdicts"][cell]
            assert verdict["score"] == 0.0, (student, cell, verdict)
            assert "The grader read your code" in verdict["message"], (student, verdict)
        assert float(result["auto_score"]) < 18.0, student


def test_a_pasted_table_of_expected_values_is_flagged() -> None:
    """Lab 01's worked examples pasted in as literals pass the visible cells in the kernel;
    the grader flags the table (issue 41, class 2)."""
    from transformer_lab.checks._common import stored_data

    lab = "01_positional_encoding"
    keys = [f"sinusoidal_encoding({k})" for k in ("5, 4", "6, 8", "3, 4, base=100")]
    tables = {key: stored_data("lab01", key)[0] for key in keys}
    nb = _notebook("solutions", lab)
    cell = next(
        c
        for c in nb.cells
        if c.metadata.get("nbgrader", {}).get("grade_id") == "sinusoidal_encoding"
    )
    cell.source = (
        f"TABLES = {tables!r}\n"
        "def sinusoidal_encoding(seq_len, d_model, base=10000.0):\n"
        "    key = f'sinusoidal_encoding({seq_len}, {d_model}'\n"
        "    key += f', base={base:g})' if base != 10000.0 else ')'\n"
        "    return torch.tensor(TABLES[key])\n"
    )
    flags = "\n".join(scan_student_code(nb))
    assert "a table of" in flags and "numbers" in flags, flags
