"""``transformer-lab labs build``: everything students receive, generated from the source.

One command, four outputs, each written only where its bytes change (a rerun is a no-op):

1. the **setup cells** of ``solutions/*/*.ipynb``, rendered from the lab standard's template
   with the course's ``kit_source`` (:mod:`transformer_lab.grading.standard`), so every lab
   installs the kit the same way;
2. the visible checks' **stored examples** ``transformer_lab/checks/fixtures/labNN.json``,
   computed by the hidden checks' oracles (:mod:`transformer_lab.grading.fixtures`);
3. the **release** ``labs/`` through nbgrader's ``GenerateAssignment`` (lock cells, replace
   solution regions by stubs, drop hidden tests and mark schemes, clear outputs), with the
   gradebook switched off (``--no-db``);
4. the **student package** ``dist/student/transformer_lab-<version>-py3-none-any.whl``: the
   kit without the grader and without the answers of labs whose deadline has not passed
   (:mod:`transformer_lab.grading.student`), stamped with a version of its own per build
   (``0.1.0.post<UTC time>``), and ``dist/student/latest.json`` naming it. The course
   publishes that folder at ``kit_source``; the setup cells read ``latest.json`` and upgrade an
   older kit.

Reference: ``nbgrader generate_assignment --no-db`` (nbgrader/converters/generate_assignment.py).
"""

from __future__ import annotations

import filecmp
import shutil
import tempfile
from pathlib import Path

from nbgrader.converters import GenerateAssignment

from transformer_lab.grading.course import (
    LABS,
    SOLUTIONS,
    GradingError,
    course_settings,
    list_labs,
    load_config,
    make_coursedir,
    read_notebook,
    run_converter,
    select_labs,
    write_notebook,
)

__all__ = [
    "LATEST",
    "STUDENT_DIST",
    "build_labs",
    "generate_release",
    "render_setup_cells",
    "sync_tree",
]

#: Where ``labs build`` writes the student package (git-ignored).
STUDENT_DIST = Path("dist") / "student"
#: Beside the wheels: the current build's version and wheel name (what the setup cells read).
LATEST = "latest.json"


def generate_release(repo: Path, out_dir: Path, labs: list[str]) -> None:
    """Generate the release of ``labs`` into ``out_dir/<lab>/`` (a fresh folder per lab).

    Raises:
        GradingError: nbgrader refused a source notebook (its log is in the message).
    """
    config = load_config(
        repo,
        SaveCells__enabled=False,
        GenerateAssignment__no_database=True,
        GenerateAssignment__create_assignment=False,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    coursedir = make_coursedir(
        config,
        repo,
        source_directory=str((repo / SOLUTIONS).resolve()),
        release_directory=str(out_dir.resolve()),
    )
    for lab in labs:
        coursedir.assignment_id = lab
        result = run_converter(GenerateAssignment, coursedir, config, force=True)
        if not result["success"]:
            raise GradingError(
                f"nbgrader could not generate the release of {lab}:\n"
                f"{result.get('error', '')}\n{result.get('log', '')}"
            )
        for nb_path in sorted((out_dir / lab).glob("*.ipynb")):
            # Re-serialise with nbformat so the bytes depend only on the notebook's content.
            write_notebook(read_notebook(nb_path), nb_path)


def sync_tree(src: Path, dst: Path) -> list[str]:
    """Make ``dst`` hold exactly the files of ``src``, writing only what differs.

    Returns:
        The paths (relative to ``dst``'s parent) that were written or removed.
    """
    changed: list[str] = []
    dst.mkdir(parents=True, exist_ok=True)
    wanted = {p.relative_to(src) for p in src.rglob("*") if p.is_file()}
    for rel in sorted(wanted):
        target = dst / rel
        if not (target.is_file() and filecmp.cmp(src / rel, target, shallow=False)):
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / rel, target)
            changed.append(str(Path(dst.name) / rel))
    for path in sorted(dst.rglob("*"), reverse=True):
        rel = path.relative_to(dst)
        if ".ipynb_checkpoints" in rel.parts:
            continue  # an editor's autosaves: not ours to remove
        if path.is_file() and rel not in wanted:
            path.unlink()
            changed.append(f"{Path(dst.name) / rel} (removed)")
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()
    return changed


def render_setup_cells(repo: Path, labs: list[str], kit_source: str) -> list[str]:
    """Rewrite each source notebook's setup cell from the standard template where it differs.

    The lab's own import lines are kept; everything else comes from the template.

    Returns:
        The source notebooks that changed.
    """
    from transformer_lab.grading.standard import setup_cell, setup_cell_imports, setup_cell_source

    changed = []
    for lab in labs:
        path = repo / SOLUTIONS / lab / f"{lab}.ipynb"
        nb = read_notebook(path)
        cell = setup_cell(nb)
        if cell is None:
            raise GradingError(f"{path} has no setup cell (grade_id 'setup'): see docs/labs.md")
        want = setup_cell_source(lab, kit_source, setup_cell_imports(cell.source))
        if cell.source != want:
            cell.source = want
            write_notebook(nb, path)
            changed.append(f"{SOLUTIONS}/{lab}/{lab}.ipynb (setup cell)")
    return changed


def build_student_package(repo: Path) -> tuple[Path, list[str]] | None:
    """Build ``dist/student/*.whl`` with the labs that are still locked, stamped with this
    build's version, and ``latest.json`` beside it; None without sources."""
    import datetime as dt
    import json

    from transformer_lab import __version__
    from transformer_lab.grading.student import build_student_wheel, build_version, locked_labs

    if not (repo / "transformer_lab").is_dir() or not (repo / "pyproject.toml").is_file():
        return None
    settings = course_settings(repo)
    now = dt.datetime.now(dt.timezone.utc)
    locked = locked_labs(list_labs(repo), settings.deadlines, now)
    version = build_version(__version__.split(".post")[0], now)
    build = build_student_wheel(repo, repo / STUDENT_DIST, locked, version=version)
    latest = {
        "version": version,
        "wheel": build.wheel.name,
        "built": now.isoformat(timespec="seconds"),
        "locked": list(build.locked_labs),
    }
    (repo / STUDENT_DIST / LATEST).write_text(json.dumps(latest, indent=1) + "\n")
    for older in (repo / STUDENT_DIST).glob("transformer_lab-*.whl"):
        if older != build.wheel:
            older.unlink()  # an earlier build of this generated folder: latest.json names this one
    return build.wheel, list(build.locked_labs)


def build_labs(repo: Path, labs: list[str] | None = None, *, student: bool = True) -> list[str]:
    """Regenerate setup cells, stored examples and ``labs/<lab>/`` for the selected labs.

    Args:
        repo: repository root.
        labs: lab names or prefixes; all labs when empty.
        student: also build the student package into ``dist/student/``.

    Returns:
        The files that changed (empty when everything was already up to date; the student
        package, which git ignores, is not listed).
    """
    from transformer_lab.grading.fixtures import write_fixtures

    chosen = select_labs(repo, labs)
    settings = course_settings(repo)
    changed = render_setup_cells(repo, chosen, settings.kit_source)
    changed += write_fixtures(repo, chosen)
    with tempfile.TemporaryDirectory(prefix="tlab-build-") as tmp:
        generate_release(repo, Path(tmp), chosen)
        for lab in chosen:
            changed += [f"{LABS}/{c}" for c in sync_tree(Path(tmp) / lab, repo / LABS / lab)]
    if student:
        build_student_package(repo)
    return changed
