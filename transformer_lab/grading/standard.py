"""The lab standard: how every lab notebook is laid out, as code that builds and checks it.

``docs/labs.md`` explains the standard to authors; this module is its single source:

* the texts every lab shares word for word (:data:`HOW_GRADING_WORKS`, the setup cell built by
  :func:`setup_cell_source`, :data:`BEFORE_SUBMITTING`);
* :func:`lint_lab`, which walks a source notebook and returns every place it drifts from the
  standard (``tests/test_lab_standard.py`` runs it on every lab; ``labs check`` too);
* :func:`new_lab`, behind ``transformer-lab labs new NN_name``, which starts a lab that
  already passes :func:`lint_lab`.

The order of a lab, exercise by exercise: explanation -> ``### Exercise k (P points): `name```
-> answer cell -> a free "Try it" cell -> visible check cell(s) -> hidden check cell(s) ->
demo cells that run the student's own code -> (sometimes) a written question and its answer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from transformer_lab.checks.spec import EXERCISE_HEADING

__all__ = [
    "BEFORE_SUBMITTING",
    "DEFAULT_KIT_SOURCE",
    "HOW_GRADING_WORKS",
    "cell_role",
    "lint_lab",
    "new_lab",
    "setup_cell",
    "setup_cell_imports",
    "setup_cell_source",
]

#: Where the setup cell installs the kit from until the course sets ``kit_source``.
DEFAULT_KIT_SOURCE = "https://YOUR-COURSE-SITE/kit/"

HOW_GRADING_WORKS = (
    "**How grading works.** Each exercise is followed by test cells. The visible checks run "
    "here and tell you what is wrong when they fail; the hidden checks, with other inputs, run "
    "when your submission is graded, in a fresh kernel that runs every cell from the top. "
    "Write your code only where it says `# YOUR CODE HERE`, keep the names and signatures, and "
    "do not delete, copy or move cells. While this lab is open the kit you installed does not "
    "contain its answers, and a graded function that calls PyTorch's own version of what it "
    "asks for earns nothing. Changing the checks or what they use is detected, and such a "
    "submission goes to your instructor. Your feedback names every check that failed and why."
)

BEFORE_SUBMITTING = (
    "Before submitting: *Kernel > Restart & Run All*, check that every visible check says it "
    "passed, then save the notebook."
)

_SETUP_TEMPLATE = """\
# Setup (locked): installs the kit where it is missing (Colab) or older than the course's current
# build, then seeds, pins the CPU threads and picks the device, precision and run profile.
KIT_SOURCE = "{kit_source}"

import json
import re
import subprocess
import sys
import urllib.request

try:
    import transformer_lab
except ImportError:  # Colab or a fresh machine: the course's student package is installed below
    transformer_lab = None
# KIT_SOURCE: the course's kit folder (or a wheel in it); its latest.json names the current build.
kit_site = KIT_SOURCE.rsplit("/", 1)[0] if KIT_SOURCE.endswith(".whl") else KIT_SOURCE.rstrip("/")
try:
    with urllib.request.urlopen(kit_site + "/latest.json", timeout=10) as reply:
        latest = json.load(reply)
except (OSError, ValueError) as exc:
    latest, unread = None, getattr(exc, "reason", exc)
have = getattr(transformer_lab, "__version__", None)
if have is None and latest is None and not KIT_SOURCE.endswith(".whl"):
    raise SystemExit(
        f"Could not read {{kit_site}}/latest.json ({{unread}}), which names the kit to install. "
        "Check the internet connection, or ask your instructor for the kit's address."
    )
if have is None or (latest and latest["version"] != have):
    wheel = f"{{kit_site}}/{{latest['wheel']}}" if latest else KIT_SOURCE
    if have is None:
        print(f"Installing the transformer-lab kit from {{wheel}} ...")
    else:
        print(f"Updating the transformer-lab kit from {{have}} to {{latest['version']}} ...")
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", wheel], capture_output=True, text=True
    )
    if pip.returncode != 0:  # pip's last error, without a terminal's colour codes
        said = re.sub(r"\\x1b\\[[0-9;]*[A-Za-z]", "", pip.stderr).splitlines()
        said = [line.strip() for line in said if line.strip()] or ["pip failed"]
        reason = [line for line in said if line.startswith("ERROR")][-1:] or said[-1:]
        raise SystemExit(
            f"Could not install the kit from {{wheel}} ({{reason[0]}}). Check the internet "
            "connection, or ask your instructor for the kit's address."
        )
    for name in [m for m in sys.modules if m.partition(".")[0] == "transformer_lab"]:
        del sys.modules[name]  # the new build replaces the one this kernel imported
    import transformer_lab

{imports}from transformer_lab import lab
from transformer_lab.checks import {checks}
{kit_imports}
session = lab.setup("{lab}")
device, PROFILE = session.device, session.profile
"""

_IMPORT = re.compile(r"^(import \S.*|from \S+ import \S.*)$")


def setup_cell_source(lab: str, kit_source: str, imports: Iterable[str] = ()) -> str:
    """The setup cell of ``lab``: the shared template plus the lab's own import lines.

    Args:
        lab: the lab's folder name, ``NN_name``.
        kit_source: what ``pip install`` installs the kit from (the course's student package).
        imports: the lab's extra ``import``/``from ... import`` lines (sorted, deduplicated).
    """
    extra = sorted(
        dict.fromkeys(line.strip() for line in imports if line.strip()),
        key=lambda line: (line.startswith("from "), line),
    )
    outside = [line for line in extra if "transformer_lab" not in line]
    kit = [line for line in extra if "transformer_lab" in line]
    return _SETUP_TEMPLATE.format(
        kit_source=kit_source,
        checks=f"lab{lab[:2]}",
        imports="\n".join(outside) + "\n\n" if outside else "",
        kit_imports="\n".join(kit) + "\n" if kit else "",
        lab=lab,
    ).rstrip("\n")


def setup_cell_imports(source: str) -> list[str]:
    """The lab's own import lines in a setup cell (those the template does not have)."""
    template = set(_SETUP_TEMPLATE.splitlines())
    after_install = source.split("import transformer_lab\n\n", 1)[-1]
    found = []
    for line in after_install.splitlines():
        ours = line in template or "transformer_lab.checks" in line
        if _IMPORT.match(line) and not ours and line != "from transformer_lab import lab":
            found.append(line)
    return found


# --------------------------------------------------------------------------------------
# Cell roles
# --------------------------------------------------------------------------------------

_QUESTION = re.compile(r"^\*\*Question (\d+) \((\d+) points?\)\.\*\*", re.M)
_TEST_HEAD = re.compile(r"^# (Visible|Hidden) check \((\d+) points?\): \S")


def _meta(cell: NotebookNode) -> dict:
    meta = cell.get("metadata", {}).get("nbgrader")
    return meta if isinstance(meta, dict) else {}


def cell_role(cell: NotebookNode) -> str:
    """What a cell is in the standard.

    Returns:
        One of ``intro``, ``setup``, ``answer``, ``visible``, ``hidden``, ``try``,
        ``settings`` (an unlocked ``# Your settings`` cell: values the demos after it read,
        which a locked demo's advice can tell the student to change), ``demo``, ``question``,
        ``written``, ``summary``, ``prose`` and ``free`` (an unlocked code cell that is neither
        a "Try it" nor a settings cell: not allowed).
    """
    meta, source = _meta(cell), cell.source.lstrip()
    if cell.cell_type == "markdown":
        if meta.get("grade") and meta.get("solution"):
            return "written"
        if meta.get("grade_id") == "intro":
            return "intro"
        if _QUESTION.match(source):
            return "question"
        if source.startswith("## Summary"):
            return "summary"
        return "prose"
    if meta.get("grade_id") == "setup":
        return "setup"
    if meta.get("solution"):
        return "answer"
    if meta.get("grade"):
        return "hidden" if "### BEGIN HIDDEN TESTS" in cell.source else "visible"
    if source.startswith("# Try it"):
        return "try"
    if source.startswith("# Your settings") and not meta.get("locked"):
        return "settings"
    return "demo" if meta.get("locked") else "free"


def setup_cell(nb: NotebookNode) -> NotebookNode | None:
    """The notebook's setup cell (the one whose role is ``setup``), or None."""
    return next((cell for cell in nb.cells if cell_role(cell) == "setup"), None)


# --------------------------------------------------------------------------------------
# The lint
# --------------------------------------------------------------------------------------


def _points_word(points: int) -> str:
    return f"{points} point{'s' * (points != 1)}"


def lint_lab(nb: NotebookNode, lab: str, kit_source: str | None = None) -> list[str]:
    """Every place where the source notebook of ``lab`` drifts from the lab standard.

    Args:
        nb: the source notebook (``solutions/NN_name/NN_name.ipynb``).
        lab: the lab's folder name.
        kit_source: the setup cell's expected ``KIT_SOURCE`` (``None``: any value).

    Returns:
        Problems as sentences, each naming the cell (1-based) and what to change.
    """
    problems: list[str] = []
    cells = nb.cells
    roles = [cell_role(c) for c in cells]
    number = lab[:2]

    def at(i: int, text: str) -> None:
        problems.append(f"{lab} cell {i + 1}: {text}")

    if len(cells) < 4:
        return [f"{lab}: a lab has at least an intro, a setup cell, an exercise and a summary"]

    # The intro.
    intro = cells[0].source
    if roles[0] != "intro" or not _meta(cells[0]).get("locked"):
        at(0, "the first cell is the intro: markdown, locked, grade_id 'intro'")
    if not re.match(rf"# Lab {number}: \S", intro):
        at(0, f"the intro starts with '# Lab {number}: <title>'")
    for needle, what in (
        ("**You will write**", "the '**You will write**' table of graded functions and points"),
        (HOW_GRADING_WORKS, "the standard 'How grading works' paragraph (HOW_GRADING_WORKS)"),
        ("**Time:** about", "a '**Time:** about ...' line (reading/writing time and run times)"),
        ("**Reading:**", "a '**Reading:**' line"),
    ):
        if needle not in intro:
            at(0, f"the intro lacks {what}")
    if "**Reading:**" in intro and not re.search(
        r"\*\*Reading:\*\*.*Understanding Deep Learning\*?, sections? 12\.\d", intro
    ):
        at(0, "the Reading line cites Prince, *Understanding Deep Learning*, section 12.x")

    # The setup cell.
    if roles[1] != "setup" or cells[1].cell_type != "code" or not _meta(cells[1]).get("locked"):
        at(1, "the second cell is the locked setup cell (grade_id 'setup')")
    else:
        want = setup_cell_source(
            lab, kit_source or _kit_source_of(cells[1].source), setup_cell_imports(cells[1].source)
        )
        if cells[1].source.rstrip("\n") != want:
            at(1, "the setup cell differs from the standard template: run `labs build`")

    # Exercises: heading -> answer -> try -> visible checks -> hidden checks.
    exercise_no = 0
    written_no = 0
    heading: tuple[int, int, str, int] | None = None  # (number, points, name, cell)
    for i, (cell, role) in enumerate(zip(cells, roles, strict=True)):
        if cell.cell_type == "code" and cell.get("outputs"):
            at(i, "has outputs: commit notebooks without outputs")
        if role == "free":
            at(
                i,
                "a free code cell must start with '# Try it' or '# Your settings', or be "
                "locked (a demo)",
            )
        if role == "prose" and (found := EXERCISE_HEADING.search(cell.source)):
            heading = (int(found.group(1)), int(found.group(2)), found.group(3), i)
        if role == "answer":
            exercise_no += 1
            problems += _lint_exercise(lab, cells, roles, i, heading, exercise_no)
            heading = None
        if role in ("visible", "hidden"):
            problems += _lint_test(lab, cell, role, i)
        if role == "written":
            written_no += 1
            points = _meta(cell).get("points", 0)
            q = _QUESTION.match(cells[i - 1].source.lstrip()) if i else None
            if roles[i - 1] != "question" or not q:
                at(i, "a written answer follows its '**Question k (P points).**' cell")
            elif (int(q.group(1)), int(q.group(2))) != (written_no, points):
                at(
                    i - 1,
                    f"should be **Question {written_no} ({_points_word(points)}).**, "
                    "numbered in order with the answer cell's points",
                )
            if not cell.source.lstrip().startswith("**Model answer and rubric"):
                at(i, "a written answer cell starts with '**Model answer and rubric'")
    if exercise_no == 0:
        problems.append(f"{lab}: no graded exercise (answer cell)")
    if written_no == 0:
        problems.append(f"{lab}: no written question")
    questions = " ".join(c.source for c, r in zip(cells, roles, strict=True) if r == "question")
    if not re.search(r"would happen if|what happens if", questions, re.I):
        problems.append(
            f"{lab}: no 'What would happen if ...' question that an experiment in the notebook "
            "can answer"
        )
    if not any("yours_or_kit(" in c.source for c in cells if c.cell_type == "code"):
        problems.append(
            f"{lab}: no demo runs the student's own code (`lab.yours_or_kit(...)` in a demo cell)"
        )
    written_total = sum(
        _meta(c).get("points", 0) for c, r in zip(cells, roles, strict=True) if r == "written"
    )
    if written_total and f"({_points_word(written_total)}, graded by hand)" not in intro:
        at(
            0,
            f"the intro says the written questions give '({_points_word(written_total)}, "
            "graded by hand)'",
        )
    if roles[-1] != "summary" or BEFORE_SUBMITTING not in cells[-1].source:
        at(len(cells) - 1, "the last cell is '## Summary' ending with BEFORE_SUBMITTING")
    return problems


def _kit_source_of(source: str) -> str:
    found = re.search(r'^KIT_SOURCE = "([^"]*)"', source, re.M)
    return found.group(1) if found else DEFAULT_KIT_SOURCE


def _lint_exercise(
    lab: str,
    cells: list[NotebookNode],
    roles: list[str],
    i: int,
    heading: tuple[int, int, str, int] | None,
    number: int,
) -> list[str]:
    problems: list[str] = []
    answer = cells[i]
    name = _meta(answer).get("grade_id", "?")
    if heading is None:
        return [
            f"{lab} cell {i + 1}: answer cell '{name}' needs a '### Exercise {number} "
            "(P points): `name`' heading in the markdown before it"
        ]
    h_number, h_points, h_name, h_cell = heading
    if not re.search(rf"^(def|class) {re.escape(h_name)}\b", answer.source, re.M):
        problems.append(
            f"{lab} cell {i + 1}: the heading in cell {h_cell + 1} names `{h_name}`, which this "
            "answer cell does not define"
        )
    if h_number != number:
        problems.append(f"{lab} cell {h_cell + 1}: exercise {h_number} should be number {number}")
    j = i + 1
    if j >= len(cells) or roles[j] != "try":
        problems.append(f"{lab} cell {i + 1}: an answer cell is followed by a '# Try it' cell")
    else:
        j += 1
    tests = []
    # A locked demo cell may sit between the checks (a training run the next check judges).
    while j < len(cells) and roles[j] in ("visible", "hidden", "demo"):
        if roles[j] == "demo" and not (
            j + 1 < len(cells) and roles[j + 1] in ("visible", "hidden")
        ):
            break
        if roles[j] != "demo":
            tests.append((j, roles[j]))
        j += 1
    kinds = [r for _, r in tests]
    if "visible" not in kinds:
        problems.append(f"{lab} cell {i + 1}: `{h_name}` has no visible check cell after it")
    if kinds != sorted(kinds, key=lambda r: r == "hidden"):
        problems.append(f"{lab} cell {i + 1}: `{h_name}`'s visible checks come before its hidden")
    points = sum(_meta(cells[k]).get("points", 0) for k, _ in tests)
    if points != h_points:
        problems.append(
            f"{lab} cell {h_cell + 1}: the heading gives `{h_name}` {h_points} points, its test "
            f"cells {points}"
        )
    table = cells[0].source
    if not re.search(rf"`{re.escape(h_name)}[^|\n]*\|\s*{h_points}\s*\|", table):
        problems.append(f"{lab} cell 1: the intro's table lacks a row `{h_name}...` | {h_points} |")
    return problems


def _lint_test(lab: str, cell: NotebookNode, role: str, i: int) -> list[str]:
    problems: list[str] = []
    meta = _meta(cell)
    head = _TEST_HEAD.match(cell.source)
    kind = "Visible" if role == "visible" else "Hidden"
    points = meta.get("points", 0)
    if not meta.get("locked"):
        problems.append(f"{lab} cell {i + 1}: test cells are locked")
    if not head or head.group(1) != kind or int(head.group(2)) != points:
        problems.append(
            f"{lab} cell {i + 1}: a {role} test cell starts with "
            f"'# {kind} check ({_points_word(points)}): what it checks'"
        )
    if role == "visible" and not re.search(rf"\blab{lab[:2]}\.check_\w+\(", cell.source):
        problems.append(f"{lab} cell {i + 1}: a visible test cell calls lab{lab[:2]}.check_...")
    if role == "visible" and not re.search(r"print\(.*passed", cell.source):
        problems.append(f"{lab} cell {i + 1}: a visible test cell prints that it passed")
    if role == "hidden":
        hidden = cell.source.split("### BEGIN HIDDEN TESTS")[-1].split("### END HIDDEN TESTS")[0]
        if "### END HIDDEN TESTS" not in cell.source or "hidden_check_" not in hidden:
            problems.append(
                f"{lab} cell {i + 1}: a hidden test cell calls hidden_check_... between "
                "### BEGIN HIDDEN TESTS and ### END HIDDEN TESTS"
            )
        if "hidden_check_" in cell.source.replace(hidden, ""):
            problems.append(f"{lab} cell {i + 1}: hidden checks are called only inside the region")
    return problems


# --------------------------------------------------------------------------------------
# labs new
# --------------------------------------------------------------------------------------


def _md(source: str, **nbgrader: object) -> NotebookNode:
    cell = nbformat.v4.new_markdown_cell(source)
    if nbgrader:
        cell.metadata["nbgrader"] = {"schema_version": 3, **nbgrader}
    return cell


def _code(source: str, **nbgrader: object) -> NotebookNode:
    cell = nbformat.v4.new_code_cell(source)
    if nbgrader:
        cell.metadata["nbgrader"] = {"schema_version": 3, **nbgrader}
    return cell


def _locked(grade_id: str) -> dict[str, object]:
    return {"grade": False, "solution": False, "locked": True, "grade_id": grade_id}


def _test(grade_id: str, points: int) -> dict[str, object]:
    return {
        "grade": True,
        "solution": False,
        "locked": True,
        "grade_id": grade_id,
        "points": points,
    }


def new_lab_notebook(lab: str, title: str, kit_source: str = DEFAULT_KIT_SOURCE) -> NotebookNode:
    """A skeleton source notebook for ``lab`` that passes :func:`lint_lab`.

    One exercise (``example``, 2 points), one written question (2 points), a demo that runs the
    student's function, and the standard texts; the author replaces the placeholders.
    """
    number = lab[:2]
    checks = f"lab{number}"
    cells = [
        _md(
            f"# Lab {number}: {title}\n\n"
            "What this lab is about and why it matters, in two or three sentences.\n\n"
            "**You will write**, graded automatically:\n\n"
            "| what | points |\n|---|---|\n| `example(x)` | 2 |\n\n"
            "and answer one written question (2 points, graded by hand).\n\n"
            "**Time:** about 30 minutes to read and write; the notebook runs in about 5 s on a "
            "2-core CPU (grading profile) and about 5 s in the full profile.\n\n"
            f"{HOW_GRADING_WORKS}\n\n"
            "**Reading:** Prince, *Understanding Deep Learning*, section 12.1.",
            grade=False,
            solution=False,
            locked=True,
            grade_id="intro",
        ),
        _code(setup_cell_source(lab, kit_source, ["import torch"]), **_locked("setup")),
        _md(
            "## 1. The idea\n\nExplain the idea, then the exercise.\n\n"
            "### Exercise 1 (2 points): `example`\n\nWrite `example(x)` that returns `2 * x`."
        ),
        _code(
            "def example(x: torch.Tensor) -> torch.Tensor:\n"
            '    """Twice x."""\n'
            "    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION",
            grade=False,
            solution=True,
            locked=False,
            grade_id="example",
        ),
        _code("# Try it: call your function on small inputs here.\n"),
        _code(
            "# Visible check (1 point): a worked example.\n"
            f"{checks}.check_example(example)\n"
            'print("example: visible check passed")',
            **_test("test_example_visible", 1),
        ),
        _code(
            "# Hidden check (1 point): random inputs.\n"
            "### BEGIN HIDDEN TESTS\n"
            f"from transformer_lab.grading.hidden import {checks} as hidden{number}\n\n"
            f"hidden{number}.hidden_check_example(example, seed={int(number)}01)\n"
            "### END HIDDEN TESTS",
            **_test("test_example_hidden", 1),
        ),
        _code(
            f"twice = lab.yours_or_kit(example, check={checks}.check_example, "
            f'kit="transformer_lab.{checks}_example")\n'
            "print(twice(torch.arange(3)))",
            **_locked("demo_example"),
        ),
        _md(
            "**Question 1 (2 points).** What would happen if `example` returned `x + x`? "
            "Use the cell above to find out."
        ),
        _md(
            "**Model answer and rubric (instructors only; students see an empty answer cell).**"
            "\n\n- 2 points: nothing changes, `x + x == 2 * x`.",
            grade=True,
            solution=True,
            locked=False,
            grade_id="written_example",
            points=2,
        ),
        _md(f"## Summary\n\n- What the student learned.\n\n{BEFORE_SUBMITTING}"),
    ]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata.update(
        {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        }
    )
    return nb


_CHECKS_TEMPLATE = '''"""Visible checks of lab {number} ({title}), called by the visible test cells.

Each ``check_<name>(fn)`` runs the student's function on small worked examples and raises
``AssertionError`` with a message the student can act on. No oracle lives here: expected values
are stored for the worked examples, or computed with PyTorch's own functions.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from transformer_lab.checks import spec
from transformer_lab.checks._common import call_forbidding, expect_close

__all__ = ["check_example"]

#: The lab's spec (``specs/lab{number}.toml``): its bans and shared tolerances.
SPEC = spec.load("{lab}")
_BAN = SPEC.ban("own")


def check_example(fn: Callable[..., torch.Tensor]) -> None:
    """``fn(torch.tensor([1.0, 2.0]))`` is ``[2, 4]``."""
    got = call_forbidding(fn, (torch.tensor([1.0, 2.0]),), {{}}, ban=_BAN, what="example([1, 2])")
    expect_close(got, torch.tensor([2.0, 4.0]), "example([1, 2])", hint="Multiply by two.")
'''

_HIDDEN_TEMPLATE = '''"""Hidden checks of lab {number} ({title}): only the grader has them.

Each ``hidden_check_<name>(fn, seed=...)`` compares the student's function with an independent
oracle on seeded random inputs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from transformer_lab.checks._common import call_forbidding, expect_close, generator
from transformer_lab.checks.lab{number} import SPEC

__all__ = ["hidden_check_example"]

_BAN = SPEC.ban("own")


def hidden_check_example(fn: Callable[..., torch.Tensor], seed: int = 0) -> None:
    """Random inputs against ``x + x``."""
    x = torch.randn(5, generator=generator(seed))
    got = call_forbidding(fn, (x,), {{}}, ban=_BAN, what="example(x)")
    expect_close(got, x + x, "example(x) on random x")
'''


_SPEC_TEMPLATE = """\
# The spec of lab {number} ({title}): its graded parts in the notebook's order, what each
# builds on, and the test cells each catalogued mistake costs (transformer_lab/checks/spec.py).

lab = "{lab}"

# What graded code may not call while a check runs it (transformer_lab.judge.bans.Ban).
[bans.own]
# ops = ["softmax"]                            # torch op families or operator names
# functions = ["transformer_lab.<module>"]     # the kit's answer, PyTorch's ready-made layer
reason = "lab {number} asks you to write it yourself"

# Tolerances the visible and hidden checks share: SPEC.tol("float32").
[tolerance]
float32 = 1e-4

[parts.example]
points = 2                                     # the exercise heading's points
signature = "example(x)"                       # the call, as the curriculum writes it
bans = ["own"]
# kit = ["transformer_lab.<module>.example"]   # the @graded("{lab}") implementation
# builds_on = {{ earlier_part = "_its_stand_in" }}

[parts.example.mistakes]
# "example doubled_twice" = ["test_example_visible", "test_example_hidden"]
"""


def new_lab(repo: Path, lab: str, title: str, kit_source: str = DEFAULT_KIT_SOURCE) -> list[Path]:
    """Start lab ``lab`` from the standard: notebook, visible checks, hidden checks.

    Raises:
        FileExistsError: one of the files already exists (nothing is overwritten).
        ValueError: ``lab`` is not ``NN_name``.
    """
    if not re.match(r"^\d\d_[a-z0-9_]+$", lab):
        raise ValueError(f"lab={lab!r} is not a lab folder name such as '09_vision_transformer'")
    number = lab[:2]
    files = {
        repo / "solutions" / lab / f"{lab}.ipynb": None,
        repo / "transformer_lab" / "checks" / f"lab{number}.py": _CHECKS_TEMPLATE,
        repo / "transformer_lab" / "grading" / "hidden" / f"lab{number}.py": _HIDDEN_TEMPLATE,
        repo / "transformer_lab" / "checks" / "specs" / f"lab{number}.toml": _SPEC_TEMPLATE,
    }
    for path in files:
        if path.exists():
            raise FileExistsError(f"{path} already exists: pick another lab name")
    for path, template in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if template is None:
            text = nbformat.writes(new_lab_notebook(lab, title, kit_source))
            path.write_text(text + "\n", encoding="utf-8")
        else:
            text = template.format(number=number, title=title, lab=lab)
            path.write_text(text, encoding="utf-8")
    return list(files)


#: A lab's course code (what its budget counts) and what else a lab costs, by file pattern.
_COURSE_CODE = {
    "visible checks": "transformer_lab/checks/lab{n}.py",
    "hidden checks": "transformer_lab/grading/hidden/lab{n}.py",
    "spec": "transformer_lab/checks/specs/lab{n}.toml",
}
#: The check modules two or more labs share (counted beside the labs, not in one).
_SHARED = {
    "visible checks": "transformer_lab/checks/_[!_]*.py",
    "hidden checks": "transformer_lab/grading/hidden/_[!_]*.py",
}
_BESIDES = {"figures": "transformer_lab/figures/lab{n}.py", "tests": "tests/test_lab{n}_*.py"}


def _lines(repo: Path, pattern: str) -> int:
    return sum(len(p.read_text(encoding="utf-8").splitlines()) for p in repo.glob(pattern))


def course_code_table(repo: Path, labs: Iterable[str]) -> str:
    """``docs/labs.md``'s markdown table of what each lab costs in lines, read from the tree:
    its course code (visible checks, hidden checks, spec; figures excluded) and, beside it, its
    figures and its tests (``tests/test_labNN_*.py``). Then the labs' totals (what the budget
    counts), the shared check modules (``checks/_*.py``, ``grading/hidden/_*.py``: judges that
    two or more labs use) and the totals with them, so that moving code out of a lab shows."""
    columns = [*_COURSE_CODE, "course code", *_BESIDES]
    rows = [f"| lab | {' | '.join(columns)} |", "|---" * (len(columns) + 1) + "|"]
    totals = dict.fromkeys(columns, 0)

    def row(name: str, counts: dict[str, int]) -> str:
        return f"| {name} | " + " | ".join(str(counts[c]) for c in columns) + " |"

    for lab in labs:
        n = lab[:2]
        counts = {name: _lines(repo, p.format(n=n)) for name, p in _COURSE_CODE.items()}
        counts["course code"] = sum(counts.values())
        counts |= {name: _lines(repo, p.format(n=n)) for name, p in _BESIDES.items()}
        rows.append(row(lab, counts))
        totals = {c: totals[c] + counts[c] for c in columns}
    rows.append(row("labs", totals))
    shared = dict.fromkeys(columns, 0) | {name: _lines(repo, p) for name, p in _SHARED.items()}
    shared["course code"] = sum(shared[name] for name in _SHARED)
    rows.append(row("shared", shared))
    rows.append(row("all", {c: totals[c] + shared[c] for c in columns}))
    return "\n".join(rows)
