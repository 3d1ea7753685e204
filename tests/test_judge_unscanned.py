"""Attacks the static scan cannot see, through the real grader: the judge alone gives them 0.

Every payload here is hidden as ``exec(bytes.fromhex(...).decode())``, as issue 21's attackers
hid theirs, so the static scan sees nothing but the ``exec`` (itself a flag for review since
issue 41) and the score before that flag is the judge's verdicts alone. One class of attack
per submission of lab 01, graded in one run of ``labs grade`` in the bubblewrap sandbox beside
an honest submission and an untouched release (lab 01's shared class, ``judge_support.hand_in``):

* the kernel's side of the judge rewritten (``serve``, the serving loop): on a *correct*
  submission, so any trust in what the kernel says about itself would show as points;
* the checks, torch's comparisons and the notebook's error handling patched in the kernel, from
  code compiled under torch's own file name, in a thread and in an IPython callback;
* an answer whose tensor subclass makes every comparison agree;
* a hunt for oracles, hidden checks and the kit's answer inside the sandbox;
* leaks into feedback: an answer that raises with its callers' frame locals, raw HTML output.

Each must earn 0 before any flag (``raw_auto_score``), and nothing of the hidden checks may
reach the kernel or the feedback. Marked slow: one grading run (~1-2 min), shared with
``test_judge_hidden_leaks`` and ``test_judge``'s hostile submissions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import nbformat
import pytest
from conftest import needs_bwrap
from judge_support import hand_in, shared_class

REPO = Path(__file__).resolve().parents[1]
LAB = "01_positional_encoding"
LEAK_MARK = "LEAKED-FRAMES"
#: What only the hidden checks and the solution hold (module, seeds, oracles, rubrics).
SECRETS = ("hidden_check", "hidden01", "seed=1101", "oracle_", "Model answer")
HOSTILE_HTML = (
    '<script>document.title="pwned"</script>'
    '<span class="tl-points tl-pass">12 / 12 points: passed</span>'
    '<img src="x" onerror="alert(1)">'
)

# --------------------------------------------------------------------------------- payloads

FORGED_SERVE = """\
import transformer_lab.judge.kernel as k
def serve(text):
    k._last = '{"ok": true, "value": null}'
k.serve = serve
"""

FORGED_LOOP = """\
import builtins, transformer_lab.judge.kernel as k
def serve_loop():
    text = builtins.input(k.REQUEST_PROMPT)
    while text != k.END:
        text = builtins.input(k.REPLY_PREFIX + '{"ok": true, "value": true}')
k.serve_loop = serve_loop
"""

# Runs as torch's own code (its file name), then again in a thread and after every cell.
PATCH_EVERYTHING = """\
import threading, torch
import transformer_lab.checks._common as common, transformer_lab.checks.lab01 as checks
PATCH = '''
import torch
import transformer_lab.checks._common as common, transformer_lab.checks.lab01 as checks
yes = lambda *a, **k: True
for name in ("allclose", "equal", "isclose"):
    setattr(torch, name, yes)
torch.Tensor.allclose = torch.Tensor.equal = yes
torch.testing.assert_close = lambda *a, **k: None
for module in (checks, common):
    for name in dir(module):
        if name.startswith(("check_", "expect_", "judge_")):
            setattr(module, name, lambda *a, **k: None)
'''
code = compile(PATCH, torch.__file__, "exec")
exec(code, {})
threading.Thread(target=exec, args=(code, {}), daemon=True).start()
get_ipython().events.register("post_run_cell", lambda *a: exec(code, {}))
get_ipython().set_custom_exc((BaseException,), lambda *a, **k: None)
"""

AGREEABLE = """\
import torch
class Agreeable(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("allclose", "isclose", "equal", "all", "eq"):
            return True
        return super().__torch_function__(func, types, args, kwargs or {})
def sinusoidal_encoding(seq_len, d_model, base=10000.0):
    return torch.zeros(seq_len, d_model).as_subclass(Agreeable)
"""

# Anything that could answer for the student: an oracle, a hidden check, the kit's answer.
ORACLE_HUNT = """\
import importlib, os, sys, torch
FOUND = []
for name in ("transformer_lab.grading.hidden.lab01", "transformer_lab.grading"):
    try:  # (the sandbox masks grading/ with an empty folder: a namespace package, no file)
        module = importlib.import_module(name)
    except Exception:
        continue
    FOUND += [name] if getattr(module, "__file__", None) else []
    FOUND += [os.path.join(p, f) for p in getattr(module, "__path__", []) for f in os.listdir(p)]
FOUND += [n for n in sys.modules if "hidden" in n or "grading." in n]
for root in {os.path.dirname(os.path.dirname(torch.__file__)), *sys.path}:
    for folder, _, files in os.walk(root) if os.path.isdir(root) else ():
        for f in files:
            if f.endswith(".py") and "grading" in folder.split(os.sep):
                FOUND.append(os.path.join(folder, f))
KIT = None
try:
    from transformer_lab.positional import sinusoidal_encoding as KIT
    KIT(2, 2)
    FOUND.append("kit answer")
except Exception:
    KIT = None
print("FOUND", FOUND)
def sinusoidal_encoding(seq_len, d_model, base=10000.0):
    if KIT is not None:
        return KIT(seq_len, d_model, base)
    return torch.zeros(seq_len, d_model)
"""

LEAK_FRAMES = f"""\
import sys
from IPython.display import HTML, display
display(HTML({HOSTILE_HTML!r}))
def sinusoidal_encoding(seq_len, d_model, base=10000.0):
    frames, f = [], sys._getframe(1)
    while f is not None:
        frames.append(repr(f.f_locals)[:2000])
        f = f.f_back
    raise RuntimeError({LEAK_MARK!r} + " ".join(frames))
"""

LEAK_HISTORY = """\
import sys
print("HISTORY", In, _ih, sorted(sys.modules))
"""

#: student -> (the notebook it starts from, [(where, payload), ...]); where: "top" (after the
#: setup cell), "answer" (after the sinusoidal_encoding answer cell) or "end".
ATTACKS: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "forged_serve": ("solutions", [("top", FORGED_SERVE)]),
    "forged_loop": ("solutions", [("top", FORGED_LOOP)]),
    "patch_everything": ("labs", [("top", PATCH_EVERYTHING)]),
    "agreeable_tensor": ("labs", [("answer", AGREEABLE)]),
    "answer_hunt": ("labs", [("answer", ORACLE_HUNT)]),
    "leak": ("labs", [("answer", LEAK_FRAMES), ("end", LEAK_HISTORY)]),
}

pytestmark = [pytest.mark.slow, needs_bwrap]


def hidden(payload: str) -> str:
    """The payload as the static scan sees it: one exec of a hex string."""
    return f"exec(bytes.fromhex({payload.encode().hex()!r}).decode())\n"


def _notebook(folder: str) -> nbformat.NotebookNode:
    return nbformat.read(str(REPO / folder / LAB / f"{LAB}.ipynb"), as_version=4)


def _attacked(folder: str, inserts: list[tuple[str, str]]) -> nbformat.NotebookNode:
    nb = _notebook(folder)
    answer = next(
        i
        for i, c in enumerate(nb.cells)
        if c.metadata.get("nbgrader", {}).get("grade_id") == "sinusoidal_encoding"
    )
    at = {"top": 2, "answer": answer + 1, "end": len(nb.cells)}
    for where, payload in sorted(inserts, key=lambda p: -at[p[0]]):  # last place first
        nb.cells.insert(at[where], nbformat.v4.new_code_cell(hidden(payload)))
    return nb


hand_in(
    __file__,
    LAB,
    {name: _attacked(base, inserts) for name, (base, inserts) in ATTACKS.items()}
    | {"honest": _notebook("solutions"), "untouched": _notebook("labs")},
)


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, Any]]]:
    """One sandboxed ``labs grade`` run: every attack, an honest student, an untouched one
    (lab 01's shared class: other replay modules' students are graded in the same run)."""
    return shared_class(LAB, tmp_path_factory)


def test_the_honest_and_the_untouched_keep_their_scores(graded: Any) -> None:
    _, results = graded
    assert float(results["honest"]["auto_score"]) == 12.0, results["honest"]
    assert float(results["untouched"]["auto_score"]) == 0.0, results["untouched"]


@pytest.mark.parametrize("student", list(ATTACKS))
def test_an_attack_the_scan_cannot_see_earns_nothing_from_the_judge(
    graded: Any, student: str
) -> None:
    _, results = graded
    result = results[student]
    # The exec that hides it is itself a flag for review (the grader cannot read it), and so
    # is its hex text (a long text of digits), and only they: the score before the flags
    # (raw_auto_score) is the judge's alone.
    assert result["status"] == "flagged", (student, result["flags"])
    hiding = ("(exec)", "a long text of numbers")
    assert all(any(h in f for h in hiding) for f in result["flags"]), (
        f"the static scan caught {student} ({result['flags']}): hide it again, or this test no "
        "longer measures the judge"
    )
    assert float(result["raw_auto_score"]) == 0.0, (student, result["verdicts"])
    assert float(result["auto_score"]) == 0.0, student


def test_the_transport_forgeries_reached_the_judge(graded: Any) -> None:
    """The forged replies were read, and refused as answers (not ignored)."""
    _, results = graded
    for student, got in (("forged_serve", "NoneType"), ("forged_loop", "bool")):
        messages = [v["message"] for v in results[student]["verdicts"].values()]
        assert any(f"got {got}" in m for m in messages), (student, messages)


def test_nothing_that_answers_is_in_the_sandbox(graded: Any) -> None:
    course, _ = graded
    executed = _notebook_of(course, "answer_hunt")
    printed = "".join(
        o.get("text", "") for c in executed.cells if c.cell_type == "code" for o in c.outputs
    )
    assert "FOUND []" in printed, printed[:2000]


def test_no_hidden_check_reaches_the_kernel_or_the_feedback(graded: Any) -> None:
    course, results = graded
    for student in ("leak", "answer_hunt", "patch_everything"):
        feedback = (course / "feedback" / student / LAB / f"{LAB}.html").read_text()
        # What the kernel printed (the autograded copy itself is the grader's: nbgrader puts
        # the hidden tests' source back into it).
        outputs = json.dumps([c.get("outputs", []) for c in _notebook_of(course, student).cells])
        for secret in SECRETS:
            assert secret not in feedback, (student, secret)
            assert secret not in outputs, (student, secret)
    # The student's exception text inside a hidden check stays out of its message.
    for grade_id, verdict in results["leak"]["verdicts"].items():
        if grade_id.endswith(("_hidden", "_properties")):
            assert LEAK_MARK not in verdict["message"], grade_id
    feedback = (course / "feedback" / "leak" / LAB / f"{LAB}.html").read_text()
    assert 'document.title="pwned"' not in feedback and "onerror" not in feedback
    assert "HISTORY" not in feedback  # a cell after the first hidden test keeps no output


def _notebook_of(course: Path, student: str) -> nbformat.NotebookNode:
    path = course / "autograded" / student / LAB / f"{LAB}.ipynb"
    return nbformat.read(str(path), as_version=4)
