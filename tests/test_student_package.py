"""What students receive holds no answer, oracle or hidden check (issue: grading integrity).

The student package is built as at the start of a term (every lab locked), unpacked, and scanned
for every line of every solution region of ``solutions/``, of every ``@graded`` implementation of
the kit, of every hidden-check module (oracles and mistake catalogues), and for the names of the
hidden checks and oracles. The release notebooks are scanned the same way. A locked function
still imports and says what it is when called.
"""

from __future__ import annotations

import ast
import gc
import importlib
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from transformer_lab.grading.course import list_labs
from transformer_lab.grading.student import (
    build_package_tree,
    build_student_wheel,
    graded_definitions,
    lock_source,
    locked_labs,
)

REPO = Path(__file__).resolve().parents[1]
LABS = list_labs(REPO)
MIN_LINE = 20  # shorter lines ("return out") are too common to count as a leak
# Lines that carry no answer: signatures and parameters, control-flow headers and validation,
# constructor arguments stored as attributes, the sub-layers a lab's contract names
# (``self.q_proj = nn.Linear(...)``), the error messages the labs prescribe, the first line of
# a statement that continues, empty containers, random inputs and plain allocations.
_GENERIC = re.compile(
    r"^(def |class |async def |@|if |elif |else:|for |while |try:|except|with |raise \w+Error\("
    r"|super\(\)|return$|\w+: [^=]+(= .+)?,$|\*\*?\w+|\)|self\.(\w+) = \w+$"
    r"|self\.\w+ = nn\.\w+\(|\w+=\w+,$|[\w, ]+ = \w+\.\w+$"
    # statements that continue on the next line, empty containers, inputs and allocations
    r"|.*[(\[{]$|\w+(: [^=]+)? = (\{\}|\[\]|\(\)|None|0|True|False)$"
    r"|\w+ = torch\.(randn|rand|randint|zeros|ones|empty|arange|tensor|full)\()"
)


# Plumbing that the batch format and the modules' metric collections dictate, shared by graded and
# ungraded methods alike: not an answer.
_ALLOWED = {
    "metrics = self._metrics(stage)",
    'tokens, targets = batch["tokens"], batch["targets"]',
}


def _substantial(lines: list[str]) -> set[str]:
    """The lines of ``lines`` that could give an answer away."""
    kept = set()
    for line in lines:
        text = line.strip()
        if len(text) < MIN_LINE or text.startswith(("#", '"', "'")) or _GENERIC.match(text):
            continue
        if text in _ALLOWED:
            continue
        kept.add(text)
    return kept


def _solution_lines() -> dict[str, set[str]]:
    """lab -> substantial lines that occur only inside solution or hidden-test regions."""
    found: dict[str, set[str]] = {}
    for lab in LABS:
        inside: list[str] = []
        outside: list[str] = []
        nb = nbformat.read(str(REPO / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
        for cell in nb.cells:
            region = False
            for line in cell.source.splitlines():
                if "BEGIN SOLUTION" in line or "BEGIN HIDDEN TESTS" in line:
                    region = True
                elif "END SOLUTION" in line or "END HIDDEN TESTS" in line:
                    region = False
                else:
                    (inside if region else outside).append(line)
        found[lab] = _substantial(inside) - _substantial(outside)
    return found


def _hidden_lines_and_names() -> tuple[set[str], set[str]]:
    lines: set[str] = set()
    names: set[str] = set()
    hidden = REPO / "transformer_lab" / "grading" / "hidden"
    for path in sorted(p for p in hidden.glob("*.py") if p.name != "__init__.py"):
        source = path.read_text()
        tree = ast.parse(source)
        body_lines: list[str] = []
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                names.add(node.name)
                body_lines += source.splitlines()[node.lineno : node.end_lineno]
        lines |= _substantial(body_lines)
    return lines, names


@pytest.fixture(scope="module")
def student_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The student package of a term's first day, unpacked."""
    out = tmp_path_factory.mktemp("student")
    build = build_student_wheel(REPO, out / "dist", LABS)
    with zipfile.ZipFile(build.wheel) as wheel:
        wheel.extractall(out / "site")
    return out / "site"


def _package_lines(tree: Path) -> dict[str, set[str]]:
    return {
        str(p.relative_to(tree)): {line.strip() for line in p.read_text().splitlines()}
        for p in tree.rglob("*.py")
    }


def test_the_student_package_leaves_out_the_grader(student_tree: Path) -> None:
    files = sorted(str(p.relative_to(student_tree)) for p in student_tree.rglob("*"))
    assert not [f for f in files if f.startswith("transformer_lab/grading")]
    assert "transformer_lab/checks/fixtures/lab01.json" in files
    assert any(f.endswith(".dist-info/METADATA") for f in files)


def test_no_solution_line_of_any_lab_is_in_the_student_package(student_tree: Path) -> None:
    package = _package_lines(student_tree)
    leaks = [
        f"{lab}: {line!r} in {path}"
        for lab, lines in _solution_lines().items()
        for path, text in package.items()
        for line in sorted(lines & text)
    ]
    assert leaks == []


def test_no_graded_implementation_is_in_the_student_package(student_tree: Path) -> None:
    package = _package_lines(student_tree)
    leaks = []
    for definition in graded_definitions(REPO / "transformer_lab"):
        for line in _substantial(list(definition.body_lines)):
            leaks += [
                f"{definition.module}.{definition.qualname}: {line!r} in {path}"
                for path, text in package.items()
                if line in text
            ]
    assert leaks == []


def test_no_oracle_or_hidden_check_is_in_what_students_receive(student_tree: Path) -> None:
    lines, names = _hidden_lines_and_names()
    package = _package_lines(student_tree)
    leaks = [f"{line!r} in {path}" for path, text in package.items() for line in lines & text]
    assert leaks == []
    text = "\n".join("\n".join(sorted(t)) for t in package.values())
    for lab in LABS:
        release = (REPO / "labs" / lab / f"{lab}.ipynb").read_text()
        text += release
        for marker in ("BEGIN SOLUTION", "BEGIN HIDDEN TESTS", "Model answer"):
            assert marker not in release, (lab, marker)
    public = {n for n in names if not n.startswith("_") and n != "fixtures"}
    assert sorted(n for n in public if n in text) == []


def test_locked_answers_import_and_say_what_they_are(student_tree: Path) -> None:
    code = (
        "import transformer_lab.attention as a, transformer_lab.blocks as b\n"
        "try:\n    a.softmax(None)\nexcept NotImplementedError as e:\n    print(e)\n"
        "try:\n    b.EncoderBlock(8, 2, 16)\nexcept NotImplementedError as e:\n    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=student_tree,
        env={"PYTHONPATH": str(student_tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "softmax is the answer to lab 02_self_attention" in out.stdout
    assert "EncoderBlock is the answer to lab 04_transformer_block" in out.stdout


def test_unlocked_labs_are_whole_and_grading_view_has_hidden_checks(tmp_path: Path) -> None:
    names = build_package_tree(REPO, tmp_path, LABS[1:], grader=True)
    assert not any(".positional." in n for n in names)  # lab 01 is unlocked
    assert (tmp_path / "transformer_lab" / "grading" / "hidden" / "lab01.py").is_file()
    assert not (tmp_path / "transformer_lab" / "grading" / "grade.py").exists()
    sys.path.insert(0, str(tmp_path))
    # The kit's modules as they were: later tests in this worker keep the objects they imported.
    saved = {m: sys.modules.pop(m) for m in list(sys.modules) if m.startswith("transformer_lab")}
    try:
        positional = importlib.import_module("transformer_lab.positional")
        assert positional.sinusoidal_encoding(3, 4).shape == (3, 4)
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.startswith("transformer_lab")]:
            sys.modules.pop(name)
        sys.modules.update(saved)


def test_lock_source_keeps_signature_docstring_and_valid_python() -> None:
    source = (
        '"""Mod."""\n\nfrom __future__ import annotations\n\n'
        "from transformer_lab.graded import graded\n\n\n"
        '@graded("02_x")\ndef f(x: int) -> int:\n'
        '    """Doc."""\n    # secret\n    return x + 1\n\n\n'
        '@graded("03_y")\nclass C:\n    """Doc."""\n\n    def forward(self):\n        return 1\n'
    )
    new, done = lock_source(source, {"02_x"}, "m")
    assert done == ["f"] and "secret" not in new and "return x + 1" not in new
    assert 'def f(x: int) -> int:\n    """Doc."""\n    raise LockedAnswerError(' in new
    assert "from transformer_lab.graded import LockedAnswerError" in new
    assert "return 1" in new  # lab 03 stays
    new, done = lock_source(source, {"02_x", "03_y"}, "m")
    assert done == ["f", "C"] and "return 1" not in new
    compile(new, "m", "exec")


class _ParsesWhenCollected:
    """Garbage whose finalizer parses Python, as asyncio's does when it logs a task's
    unretrieved exception (3.11's traceback module parses each line for its carets)."""

    def __init__(self) -> None:
        self.cycle = [self]

    def __del__(self) -> None:
        def deeper(n: int) -> object:
            return ast.parse("x = 1 + 2") if n == 0 else deeper(n - 1)

        deeper(40)


def test_locking_survives_a_finalizer_that_parses_python() -> None:
    """CI met ``SystemError: AST constructor recursion depth mismatch`` here: a collection
    during ``ast.parse`` ran such a finalizer. The kit parses with the collector paused."""
    source = (REPO / "transformer_lab" / "checks" / "lab03.py").read_text(encoding="utf-8")
    try:
        for _ in range(5):
            garbage = [_ParsesWhenCollected() for _ in range(3000)]
            del garbage
            lock_source(source, {"03_multi_head_attention"}, "transformer_lab.checks.lab03")
    finally:
        # Collect the rest now, outside any parse: left for later, it would run its finalizers
        # inside the next test's own ast.parse (test_import_graph's) and fail it so.
        gc.collect()


def test_deadlines_unlock_labs() -> None:
    import datetime as dt

    now = dt.datetime(2026, 10, 3, tzinfo=dt.timezone.utc)
    deadlines = {"01_a": "2026-10-02", "02_b": "2026-10-03T12:00+00:00"}
    assert locked_labs(["01_a", "02_b", "03_c"], deadlines, now) == ["02_b", "03_c"]
    assert locked_labs(["01_a", "02_b"], {}, now, unlocked=["02_b"]) == ["01_a"]
    with pytest.raises(ValueError, match="not a date"):
        locked_labs(["01_a"], {"01_a": "next friday"}, now)
    with pytest.raises(ValueError, match="unknown labs"):
        locked_labs(["01_a"], {"09_z": "2026-01-01"}, now)
