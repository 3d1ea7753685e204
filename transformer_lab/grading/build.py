"""``transformer-lab labs build``: generate the student release ``labs/`` from ``solutions/``.

nbgrader's ``GenerateAssignment`` converter does the work (lock cells, replace solution
regions by stubs, drop hidden tests and mark schemes, clear outputs, checksums), with the
gradebook switched off (``--no-db``: ``SaveCells`` disabled, ``no_database``), so building
needs no database. The release is generated into a temporary folder and then synchronised
into ``labs/``: only files whose bytes changed are rewritten and stale files are removed,
so re-running the build is a no-op for git (and for file times).

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
    load_config,
    make_coursedir,
    read_notebook,
    run_converter,
    select_labs,
    write_notebook,
)

__all__ = ["build_labs", "generate_release", "sync_tree"]


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
        if path.is_file() and rel not in wanted:
            path.unlink()
            changed.append(f"{Path(dst.name) / rel} (removed)")
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()
    return changed


def build_labs(repo: Path, labs: list[str] | None = None) -> list[str]:
    """Regenerate ``labs/<lab>/`` from ``solutions/<lab>/`` for the selected labs.

    Args:
        repo: repository root.
        labs: lab names or prefixes; all labs when empty.

    Returns:
        The release files that changed (empty when ``labs/`` was already up to date).
    """
    chosen = select_labs(repo, labs)
    changed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tlab-build-") as tmp:
        generate_release(repo, Path(tmp), chosen)
        for lab in chosen:
            changed += [f"{LABS}/{c}" for c in sync_tree(Path(tmp) / lab, repo / LABS / lab)]
    return changed
