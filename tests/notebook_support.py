"""Structure checks every lab's notebook test shares (``tests/test_labNN_notebook.py``).

Each lab's test file subclasses :class:`LabNotebookTests` and names what is particular to it
(the checks module, how many test cells there are, a line of its model answer); what a lab's
spec (``transformer_lab/checks/specs/labNN.toml``) declares is read from there, never restated:
its parts in order, each part's points (held to the headings, the test cells and the intro's
table by :func:`~transformer_lab.checks.spec.lint_spec` and the lab standard) and signature
(held to the solution cells), and so which cells define the answers. The inherited tests, built
from the helpers below, check the rest: nbgrader metadata (unique grade ids, locked tests,
solution and hidden-test markers, no outputs), the lab's spec and standard, the locked setup cell,
the checks the test cells call, running the solution through its own test cells without
nbgrader, and a release that leaks no solution. The slow end-to-end round trip (solution =
full marks, untouched release = zero) goes through the pipeline's
:func:`transformer_lab.grading.check.check_labs`.

Reference: nbgrader's cell metadata (``grade_id``, ``grade``, ``solution``, ``locked``,
``points``), https://nbgrader.readthedocs.io/en/stable/contributor_guide/metadata.html
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import nbformat
import pytest

from transformer_lab.checks.spec import LabSpec, lint_spec, load, solution_definitions
from transformer_lab.pysource import parse_python

REPO = Path(__file__).resolve().parents[1]

# Text that only the solution notebook may hold; each lab adds a line of its model answer.
RELEASE_LEAKS = ("BEGIN SOLUTION", "BEGIN HIDDEN TESTS", "hidden_check", "Model answer")


def source_path(lab: str) -> Path:
    """The nbgrader source notebook ``solutions/<lab>/<lab>.ipynb``."""
    return REPO / "solutions" / lab / f"{lab}.ipynb"


def release_path(lab: str) -> Path:
    """The generated student notebook ``labs/<lab>/<lab>.ipynb``."""
    return REPO / "labs" / lab / f"{lab}.ipynb"


def read_source(lab: str) -> Any:
    """The lab's source notebook, as an ``nbformat`` v4 node."""
    return nbformat.read(str(source_path(lab)), as_version=4)


def meta(cell: Any) -> dict[str, Any]:
    """A cell's nbgrader metadata (empty for a cell nbgrader does not know)."""
    return cell.metadata.get("nbgrader", {})


def assert_metadata(notebook: Any) -> None:
    """Unique grade ids, no outputs, locked tests, solution and hidden-test markers in place
    (the points are the spec's: :func:`~transformer_lab.checks.spec.lint_spec`)."""
    ids = [meta(c)["grade_id"] for c in notebook.cells if meta(c)]
    assert ids, "the notebook has no nbgrader cells"
    assert len(ids) == len(set(ids)), "grade ids must be unique"
    for cell in notebook.cells:
        cell_meta = meta(cell)
        assert cell.get("outputs", []) == [] and cell.get("execution_count") is None
        if cell_meta.get("grade"):
            assert cell_meta.get("locked") or cell.cell_type == "markdown", cell_meta["grade_id"]
            assert cell_meta.get("points", 0) > 0, cell_meta["grade_id"]
        if cell.cell_type == "code" and cell_meta.get("solution"):
            assert "### BEGIN SOLUTION" in cell.source and "### END SOLUTION" in cell.source
        if "hidden_check" in cell.source:
            assert cell_meta.get("grade") and cell_meta.get("locked"), cell_meta.get("grade_id")
            assert "### BEGIN HIDDEN TESTS" in cell.source, cell_meta.get("grade_id")
            hidden = cell.source.split("### BEGIN HIDDEN TESTS")[1].split("### END HIDDEN TESTS")[0]
            assert "hidden_check" in hidden
            assert "hidden_check" not in cell.source.replace(hidden, "")


def answer_cells(notebook: Any, lab_spec: LabSpec) -> tuple[str, ...]:
    """Grade ids of the solution cells that define the spec's parts, in the notebook's order."""
    ids = []
    for cell in notebook.cells:
        if cell.cell_type != "code" or not meta(cell).get("solution"):
            continue
        tree = parse_python(cell.source)
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
        if defined & set(lab_spec.parts):
            ids.append(meta(cell)["grade_id"])
    missing = set(lab_spec.parts) - set(solution_definitions(notebook))
    assert not missing, f"no solution cell defines {sorted(missing)}"
    return tuple(ids)


def assert_locked_setup_first(notebook: Any) -> Any:
    """The first code cell is the locked setup cell that installs the kit; returns it."""
    first = next(c for c in notebook.cells if c.cell_type == "code")
    assert meta(first).get("grade_id") == "setup" and meta(first).get("locked") is True
    assert "KIT_SOURCE = " in first.source and "lab.setup(" in first.source
    return first


def called_checks(notebook: Any, module: ModuleType) -> set[str]:
    """Names the notebook calls on ``module`` (``lab02.check_softmax``, ``hidden02.hidden_...``).

    The visible checks are imported as ``labNN``, the hidden ones as ``hiddenNN``.
    """
    number = module.__name__.rpartition(".")[2][3:]
    short = f"hidden{number}" if ".grading.hidden." in module.__name__ else f"lab{number}"
    return set(re.findall(rf"\b{short}\.(\w+)", "\n".join(c.source for c in notebook.cells)))


def assert_checks_exist_and_are_called(notebook: Any, *modules: ModuleType) -> None:
    """Every check the notebook calls exists, and every public check is called somewhere."""
    for module in modules:
        called = called_checks(notebook, module)
        assert called, f"the notebook calls no {module.__name__} checks"
        assert sorted(n for n in called if not hasattr(module, n)) == []
        public = {n for n in module.__all__ if n.startswith(("check_", "hidden_check_"))}
        assert public <= called, f"checks never called: {sorted(public - called)}"


def run_test_cells(notebook: Any, answers: Iterable[str], *, skip: str | None = None) -> int:
    """Run the answer cells, then every graded code cell on a copy of their namespace.

    Hidden parts run too (this is the source notebook). A failing check raises.

    Args:
        notebook: the source notebook.
        answers: grade ids of the cells that define the answers (``setup`` included).
        skip: graded cells whose grade id contains this text are not run (e.g. training).

    Returns:
        How many test cells ran, for the caller to compare with the lab's count.
    """
    wanted = set(answers)
    namespace: dict[str, Any] = {}
    for cell in notebook.cells:
        if cell.cell_type == "code" and meta(cell).get("grade_id") in wanted:
            exec(compile(cell.source, meta(cell)["grade_id"], "exec"), namespace)
    ran = 0
    for cell in notebook.cells:
        grade_id = meta(cell).get("grade_id", "")
        if meta(cell).get("grade") and cell.cell_type == "code":
            if skip is not None and skip in grade_id:
                continue
            exec(compile(cell.source, grade_id, "exec"), dict(namespace))
            ran += 1
    return ran


def run_all_cells(
    notebook: Any,
    cwd: Path,
    profile: str = "grading",
    *,
    only: Iterable[str] | None = None,
    namespace: dict[str, Any] | None = None,
) -> str:
    """Execute every code cell of ``notebook`` in order, in ``cwd`` and ``profile``; return stdout.

    What a student sees when running the notebook top to bottom, without a kernel: the lab's
    experiments print their results, which the notebook tests then read.

    Args:
        notebook: the source notebook.
        cwd: the folder the cells run in (``session.runs`` is relative to it).
        profile: ``TRANSFORMER_LAB_PROFILE`` while they run.
        only: grade ids of the cells to run (default every code cell).
        namespace: the globals the cells share, to go on from an earlier run (default new).
    """
    wanted = None if only is None else set(only)
    if namespace is None:
        namespace = {}
    namespace.setdefault("display", lambda *a, **k: None)
    printed = io.StringIO()
    old_profile = os.environ.get("TRANSFORMER_LAB_PROFILE")
    os.environ["TRANSFORMER_LAB_PROFILE"] = profile
    old_cwd = Path.cwd()
    os.chdir(cwd)  # session.runs is relative to the notebook
    try:
        with contextlib.redirect_stdout(printed):
            for cell in notebook.cells:
                name = meta(cell).get("grade_id", "cell")
                if cell.cell_type == "code" and (wanted is None or name in wanted):
                    exec(compile(cell.source, name, "exec"), namespace)
    finally:
        os.chdir(old_cwd)
        if old_profile is None:
            os.environ.pop("TRANSFORMER_LAB_PROFILE")
        else:
            os.environ["TRANSFORMER_LAB_PROFILE"] = old_profile
    return printed.getvalue()


def assert_release_clean(lab: str, *leaks: str) -> None:
    """The generated release holds no markers, hidden checks, model answers or ``leaks``."""
    release = release_path(lab)
    if not release.exists():
        pytest.skip("labs/ not generated yet (transformer-lab labs build)")
    text = release.read_text()
    for leak in (*RELEASE_LEAKS, *leaks):
        assert leak not in text, leak


def assert_round_trip(lab: str) -> None:
    """Solution full marks, untouched release zero, through nbgrader in the grading profile."""
    from conftest import GRADING_SANDBOX

    from transformer_lab.grading.check import check_labs

    assert check_labs(REPO, [lab], sandbox=GRADING_SANDBOX) == []


class LabNotebookTests:
    """The tests every lab notebook gets; a ``TestLabNN`` subclass sets the class attributes."""

    LAB: ClassVar[str]  # folder and notebook name, e.g. "02_self_attention"
    CHECKS: ClassVar[ModuleType]  # transformer_lab.checks.labNN
    HIDDEN: ClassVar[ModuleType | None] = None  # transformer_lab.grading.hidden.labNN
    SETUP: ClassVar[tuple[str, ...]] = ("setup",)  # cells run before the answer cells
    TEST_CELLS: ClassVar[int]  # how many test cells run against the answers
    SKIP: ClassVar[str | None] = None  # test cells left out of that run (e.g. training)
    LEAK: ClassVar[str]  # a line of the model answer the release must not hold
    ROUND_TRIP: ClassVar[bool] = True  # False where another test grades the lab already

    @pytest.fixture(scope="class")
    def notebook(self) -> Any:
        return read_source(self.LAB)

    @property
    def spec(self) -> LabSpec:
        """The lab's spec: its parts, their points and signatures."""
        return load(self.LAB)

    def answers(self, notebook: Any) -> tuple[str, ...]:
        """Grade ids of the cells that define the answers (the setup cells first)."""
        return (*self.SETUP, *answer_cells(notebook, self.spec))

    def test_metadata_ids_and_markers(self, notebook: Any) -> None:
        assert_metadata(notebook)

    def test_agrees_with_its_spec(self, notebook: Any) -> None:
        """Parts in order, points, signatures, costs, bans: as the spec declares them."""
        assert lint_spec(self.spec, notebook, self.LAB) == []

    def test_first_code_cell_is_the_locked_setup(self, notebook: Any) -> None:
        assert_locked_setup_first(notebook)

    def test_every_check_the_notebook_calls_exists(self, notebook: Any) -> None:
        modules = [self.CHECKS] + ([self.HIDDEN] if self.HIDDEN is not None else [])
        assert_checks_exist_and_are_called(notebook, *modules)

    def test_follows_the_lab_standard(self, notebook: Any) -> None:
        from transformer_lab.grading.standard import lint_lab

        assert lint_lab(notebook, self.LAB) == []

    def test_solution_passes_its_own_test_cells(self, notebook: Any) -> None:
        ran = run_test_cells(notebook, self.answers(notebook), skip=self.SKIP)
        assert ran == self.TEST_CELLS

    def test_release_is_generated_and_holds_no_solution(self) -> None:
        assert_release_clean(self.LAB, self.LEAK)

    @pytest.mark.slow
    def test_round_trip(self) -> None:
        """Solution full marks, untouched release zero, through nbgrader in the grading profile."""
        if not self.ROUND_TRIP:
            pytest.skip("another test grades this lab end to end")
        assert_round_trip(self.LAB)
