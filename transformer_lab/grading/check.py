"""``transformer-lab labs check``: is every lab releasable?

For each selected lab:

0. **The lab standard**: the source notebook follows ``docs/labs.md``
   (:func:`transformer_lab.grading.standard.lint_lab`), and the visible checks' stored examples
   are what the hidden checks compute.
1. **In sync**: the release is regenerated into a temporary folder and compared with
   ``labs/<lab>/`` by content: cells, sources and nbgrader metadata (a hand-edited or stale
   release fails; what an editor adds, such as kernel metadata, outputs or
   ``.ipynb_checkpoints/``, is ignored).
2. **No leaks**: no released notebook holds a solution or hidden-test delimiter, a call of a
   ``hidden_check_*`` function, a mark scheme, or a line of solution code.
3. **Round trip**: in a temporary course, the solution notebook (as a student would submit
   it) and the untouched release are autograded by :func:`grade_course` with the grading
   profile, in the bubblewrap sandbox (where it does not work, ``check`` refuses and says how
   to install it; ``--unsandboxed`` runs the round trip without it). The solution must earn
   every autograded point and run without errors; the release must score zero, and the
   grader must finish.

Every problem is returned as a sentence; the CLI exits non-zero when there is any.
"""

from __future__ import annotations

import filecmp
import shutil
import tempfile
from pathlib import Path

from transformer_lab.grading.build import generate_release
from transformer_lab.grading.course import LABS, SOLUTIONS, read_notebook, select_labs
from transformer_lab.grading.grade import GradingOptions, grade_course

__all__ = ["check_labs", "check_leaks", "check_standard", "check_sync"]

_MARKERS = (
    "BEGIN SOLUTION",
    "END SOLUTION",
    "BEGIN HIDDEN TESTS",
    "END HIDDEN TESTS",
    "BEGIN MARK SCHEME",
    "END MARK SCHEME",
    "hidden_check_",
)


def _content(path: Path) -> list[tuple[str, str, dict]]:
    """A notebook's content as grading sees it: cell types, sources and nbgrader metadata.

    Editors rewrite the rest (JupyterLab the kernel and language metadata, a run the outputs,
    nbgrader's Validate button saves the notebook), so it does not count.
    """
    cells = []
    for cell in read_notebook(path).cells:
        meta = cell.get("metadata", {})
        kept = {k: meta[k] for k in ("nbgrader", "editable", "deletable") if k in meta}
        cells.append((cell.cell_type, cell.source, kept))
    return cells


def check_sync(repo: Path, labs: list[str], built: Path) -> list[str]:
    """Compare ``labs/<lab>`` with a fresh build in ``built/<lab>`` (by content)."""
    problems: list[str] = []
    for lab in labs:
        fresh, committed = built / lab, repo / LABS / lab
        if not committed.is_dir():
            problems.append(f"{LABS}/{lab}/ is missing: run `transformer-lab labs build {lab}`")
            continue

        def files(root: Path) -> set[Path]:
            return {
                p.relative_to(root)
                for p in root.rglob("*")
                if p.is_file() and ".ipynb_checkpoints" not in p.relative_to(root).parts
            }

        want, have = files(fresh), files(committed)
        for rel in sorted(want - have):
            problems.append(f"{LABS}/{lab}/{rel} is missing from the release")
        for rel in sorted(have - want):
            problems.append(f"{LABS}/{lab}/{rel} is not generated from {SOLUTIONS}/ (stray file)")
        for rel in sorted(want & have):
            if rel.suffix == ".ipynb":
                a, b = _content(fresh / rel), _content(committed / rel)
                same = a == b
            else:
                same = filecmp.cmp(fresh / rel, committed / rel, shallow=False)
            if not same:
                where = ""
                if rel.suffix == ".ipynb":
                    diff = [i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y]
                    diff = diff or [min(len(a), len(b))]
                    where = f" (first differing cell: {diff[0] + 1})"
                problems.append(
                    f"{LABS}/{lab}/{rel} differs from what {SOLUTIONS}/ generates{where}: "
                    f"edit {SOLUTIONS}/ and run `transformer-lab labs build {lab}`"
                )
    return problems


def _figures_from_student_code(lab: str, executed: object) -> list[str]:
    """The executed solution shows figures, and its demos ran the student's own code."""
    problems = []
    cells = [c for c in executed.cells if c.cell_type == "code"]
    images = sum(1 for c in cells for o in c.get("outputs", []) if "image/png" in o.get("data", {}))
    if not images:
        problems.append(f"{lab}: the executed solution shows no figure")

    def text(cell: object) -> str:
        return "".join(str(o.get("text", "")) for o in cell.get("outputs", []))

    demos = [c for c in cells if "yours_or_kit(" in c.source]
    if demos and not any("(This uses your" in text(c) for c in demos):
        problems.append(f"{lab}: no demo of the executed solution used the student's own code")
    return problems


def check_standard(repo: Path, labs: list[str]) -> list[str]:
    """The lab standard (:func:`~transformer_lab.grading.standard.lint_lab`) and fixtures."""
    from transformer_lab.grading.course import course_settings
    from transformer_lab.grading.fixtures import check_fixtures
    from transformer_lab.grading.standard import lint_lab

    kit_source = course_settings(repo).kit_source
    problems: list[str] = []
    for lab in labs:
        nb = read_notebook(repo / SOLUTIONS / lab / f"{lab}.ipynb")
        problems += lint_lab(nb, lab, kit_source) + _spec_problems(repo, lab, nb)
    return problems + check_fixtures(repo, labs)


def _spec_problems(repo: Path, lab: str, nb: object) -> list[str]:
    """The lab's spec against its notebook: the repository's own
    ``transformer_lab/checks/specs/labNN.toml``, else the installed kit's (a course folder
    that holds the notebooks but not the kit's source)."""
    from transformer_lab.checks.spec import SpecError, lint_spec, load, parse

    path = Path(repo) / "transformer_lab" / "checks" / "specs" / f"lab{lab[:2]}.toml"
    try:
        if path.is_file():
            lab_spec = parse(path.read_text(encoding="utf-8"), str(path))
        else:
            lab_spec = load(lab)
        return lint_spec(lab_spec, nb, lab)
    except SpecError as exc:
        return [f"{lab}: {exc} (`labs new` starts a spec beside the notebook)"]


def _solution_lines(source_nb: Path) -> set[str]:
    """Substantial code lines that appear only inside solution or hidden-test regions."""
    inside: set[str] = set()
    outside: set[str] = set()
    for cell in read_notebook(source_nb).cells:
        region = False
        for line in cell.source.splitlines():
            stripped = line.strip()
            if "BEGIN SOLUTION" in line or "BEGIN HIDDEN TESTS" in line:
                region = True
            elif "END SOLUTION" in line or "END HIDDEN TESTS" in line:
                region = False
            elif len(stripped) >= 20 and not stripped.startswith("#"):
                (inside if region else outside).add(stripped)
    return inside - outside


def check_leaks(repo: Path, labs: list[str], release_root: Path | None = None) -> list[str]:
    """Look for solution text and hidden tests in the released notebooks."""
    problems: list[str] = []
    release_root = release_root or repo / LABS
    for lab in labs:
        secret = _solution_lines(repo / SOLUTIONS / lab / f"{lab}.ipynb")
        for nb_path in sorted((release_root / lab).glob("*.ipynb")):
            for i, cell in enumerate(read_notebook(nb_path).cells, start=1):
                for marker in _MARKERS:
                    if marker in cell.source:
                        problems.append(f"{LABS}/{lab}/{nb_path.name} cell {i} contains {marker!r}")
                lines = {line.strip() for line in cell.source.splitlines()}
                for line in sorted(lines & secret):
                    problems.append(
                        f"{LABS}/{lab}/{nb_path.name} cell {i} leaks solution code: {line!r}"
                    )
    return problems


def check_labs(
    repo: Path,
    labs: list[str] | None = None,
    *,
    grade: bool = True,
    timeout: int | None = None,
    keep: Path | None = None,
    sandbox: str = "required",
) -> list[str]:
    """Run every check on the selected labs.

    Args:
        repo: repository root.
        labs: lab names or prefixes (default: all).
        grade: run the nbgrader round trip (the slow part: two notebook executions per lab).
        timeout: seconds per cell for the round trip (default: the config's).
        keep: if given, the round trip's course folder is kept there for inspection.
        sandbox: ``required`` (refuse where bubblewrap does not work) or ``off``.

    Returns:
        Problems found, as sentences (empty when everything is releasable).
    """
    chosen = select_labs(repo, labs)
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tlab-check-") as tmp:
        built = Path(tmp) / "built"
        generate_release(repo, built, chosen)
        problems += check_standard(repo, chosen)
        problems += check_sync(repo, chosen, built)
        problems += check_leaks(repo, chosen)
        if not grade:
            return problems
        course = keep or Path(tmp) / "course"
        for lab in chosen:
            for student, src in (
                ("solution", repo / SOLUTIONS / lab),
                ("release", built / lab),
            ):
                dst = course / "submitted" / student / lab
                if dst.exists():
                    shutil.rmtree(dst)
                shutil.copytree(src, dst)
        options = GradingOptions(sandbox=sandbox)
        report = grade_course(course, repo, chosen, timeout=timeout, options=options)
        for lab in chosen:
            sol, rel = report.find("solution", lab), report.find("release", lab)
            if sol.status != "graded":
                why = "; ".join([sol.error, *sol.flags, *sol.problems][:4]).strip("; ")
                problems.append(f"{lab}: the solution was {sol.status}, not graded: {why}")
            elif not sol.auto_max:
                problems.append(f"{lab}: the solution has no autograded points")
            elif sol.auto_score != sol.auto_max:
                problems.append(
                    f"{lab}: the solution earns {sol.auto_score:g} of {sol.auto_max:g} "
                    "autograded points (see the feedback of student 'solution')"
                )
            if sol.status == "graded":
                for nb_path in sorted((course / "autograded" / "solution" / lab).glob("*.ipynb")):
                    executed = read_notebook(nb_path)
                    for i, cell in enumerate(executed.cells, start=1):
                        for out in cell.get("outputs", []):
                            if out.get("output_type") == "error":
                                problems.append(
                                    f"{lab}: the solution fails in cell {i} "
                                    f"({out.get('ename')}: {out.get('evalue')})"
                                )
                    problems += _figures_from_student_code(lab, executed)
            if rel.status != "graded":
                why = "; ".join([rel.error, *rel.flags, *rel.problems][:4]).strip("; ")
                problems.append(f"{lab}: the untouched release was {rel.status}: {why}")
            elif rel.auto_score != 0:
                problems.append(
                    f"{lab}: the untouched release earns {rel.auto_score:g} points; "
                    "a test cell passes without any student code"
                )
    return problems
