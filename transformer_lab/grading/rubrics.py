"""The written answers' model answers and rubrics beside each answer in formgrader.

nbgrader's formgrader shows the autograded notebook (``autograded/<student>/<lab>/<lab>.ipynb``)
with a score box per graded cell, but a written answer's rubric lives only in the source
notebook (``solutions/``: the cell starts ``**Model answer and rubric``); the release and the
gradebook hold the cleared cell. :func:`add_rubrics` puts the source cell's text right below
each written answer of every autograded notebook, as a plain markdown cell without nbgrader
metadata (so it is neither graded nor checked) and marked ``transformer_lab.rubric_for``.

Only the grader's own output is changed: students never see ``autograded/`` (their feedback
pages are written by ``labs grade`` before this runs and come from the executed notebook, not
from this one), and the submitted files are untouched. Running it twice adds nothing.
"""

from __future__ import annotations

from pathlib import Path

import nbformat

from transformer_lab.grading.course import SOLUTIONS, read_notebook, write_notebook

__all__ = ["add_rubrics", "rubrics_of"]

MARK = "rubric_for"
HEADER = "**Rubric (shown to graders only, from the source notebook)**"


def rubrics_of(repo: Path, lab: str) -> dict[str, str]:
    """Grade id -> model answer and rubric of every written (manually graded) answer of a lab."""
    source = read_notebook(Path(repo) / SOLUTIONS / lab / f"{lab}.ipynb")
    found = {}
    for cell in source.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "markdown" and meta.get("grade") and meta.get("solution"):
            found[meta["grade_id"]] = cell.source
    return found


def add_rubrics(course: Path, repo: Path, labs: list[str] | None = None) -> list[Path]:
    """Insert the rubric below each written answer in ``course/autograded``; return the notebooks
    changed."""
    changed = []
    root = Path(course) / "autograded"
    for path in sorted(root.glob("*/*/*.ipynb")) if root.is_dir() else []:
        lab = path.parent.name
        if (labs and lab not in labs) or path.stem != lab:
            continue
        rubrics = rubrics_of(repo, lab) if (Path(repo) / SOLUTIONS / lab).is_dir() else {}
        nb = read_notebook(path)
        present = {c.get("metadata", {}).get("transformer_lab", {}).get(MARK) for c in nb.cells}
        cells = []
        for cell in nb.cells:
            cells.append(cell)
            gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            if gid in rubrics and gid not in present:
                note = nbformat.v4.new_markdown_cell(f"{HEADER}\n\n{rubrics[gid]}")
                note.metadata["transformer_lab"] = {MARK: gid}
                cells.append(note)
        if len(cells) != len(nb.cells):
            nb.cells = cells
            write_notebook(nb, path)
            changed.append(path)
    return changed
