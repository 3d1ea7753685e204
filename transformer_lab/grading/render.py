"""``transformer-lab labs render``: each lab as a student who solved it sees it, to look at.

For every selected lab, the release is filled in with the solution's answers and executed in a
kernel whose kit is the student package of that lab's deadline (the lab and later ones locked),
so every figure after an exercise is drawn by the student's own code. The result is written as

* ``OUT/<lab>.ipynb``: the executed notebook, each progress bar's redraws (``\\r``) reduced to
  their last state, as JupyterLab shows them;
* ``OUT/<lab>.html``: the same in JupyterLab's look (nbconvert's ``lab`` template), math as
  MathML, images inline;
* ``OUT/<lab>.png`` (the top of the page) and ``OUT/<lab>.pdf`` (all of it), where a headless
  Chromium is installed: JavaScript off, no network, its sandbox on
  (:mod:`transformer_lab.grading.browser`), since a feedback page is built from students' work.

This is how an author (or a reviewer) checks that the figures show what the text says.

With ``--feedback COURSE``, it renders instead the feedback pages ``labs grade`` wrote
(``COURSE/feedback/<student>/<lab>/<lab>.html``, what each student is sent): each is copied to
``OUT/<student>/<lab>.html`` beside its PNG and PDF, so the judge's messages can be read as a
student reads them (``tests/test_feedback_render.py`` grades a submission that makes one typical
mistake per lab and renders it).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbformat import NotebookNode

from transformer_lab.grading.browser import screenshot
from transformer_lab.grading.course import (
    LABS,
    SOLUTIONS,
    environment,
    read_notebook,
    select_labs,
)
from transformer_lab.grading.inert import math_to_mathml

__all__ = ["filled_release", "render_feedback", "render_labs"]


def filled_release(repo: Path, lab: str) -> NotebookNode:
    """The release of ``lab`` with every answer cell holding the solution's answer."""
    release = read_notebook(repo / LABS / lab / f"{lab}.ipynb")
    source = read_notebook(repo / SOLUTIONS / lab / f"{lab}.ipynb")
    answers = {}
    for cell in source.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and cell.cell_type == "code":
            answers[meta["grade_id"]] = re.sub(
                r"[ \t]*### (BEGIN|END) SOLUTION\n?", "", cell.source
            )
    for cell in release.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in answers:
            cell.source = answers[gid]
    return release


def render_labs(
    repo: Path, labs: list[str] | None, out: Path, *, profile: str = "grading"
) -> list[Path]:
    """Execute and render the selected labs into ``out``; return the files written."""
    from nbconvert import HTMLExporter
    from nbconvert.preprocessors import CoalesceStreamsPreprocessor

    from transformer_lab.grading.student import build_package_tree

    out.mkdir(parents=True, exist_ok=True)
    all_labs = select_labs(repo, None)
    written: list[Path] = []
    for lab in select_labs(repo, labs):
        nb = filled_release(repo, lab)
        with tempfile.TemporaryDirectory(prefix="tlab-render-") as tmp:
            view = Path(tmp) / "view"
            build_package_tree(repo, view, all_labs[all_labs.index(lab) :], grader=False)
            work = Path(tmp) / "work"
            work.mkdir()
            env = {
                "PYTHONPATH": str(view),
                "TRANSFORMER_LAB_PROFILE": profile,
                "TRANSFORMER_LAB_THREADS": "1",
                "OMP_NUM_THREADS": "1",
                "MPLBACKEND": "module://matplotlib_inline.backend_inline",
            }
            with environment(**env):
                NotebookClient(
                    nb,
                    timeout=600,
                    kernel_name="python3",
                    allow_errors=True,
                    resources={"metadata": {"path": str(work)}},
                ).execute()
        # A text progress bar is one line redrawn after "\r": keep its last state, not pages.
        nb, _ = CoalesceStreamsPreprocessor().preprocess(nb, {})
        executed = out / f"{lab}.ipynb"
        nbformat.write(nb, str(executed))
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = math_to_mathml(cell.source)
        body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
        body = re.sub(r"<script[^>]*>[^<]*MathJax[^<]*</script>", "", body, flags=re.S)
        html = out / f"{lab}.html"
        html.write_text(body, encoding="utf-8")
        written += [executed, html]
        written += screenshot(html, out / f"{lab}.png", out / f"{lab}.pdf")
    return written


def render_feedback(
    course: Path, out: Path, *, students: list[str] | None = None, labs: list[str] | None = None
) -> list[Path]:
    """Copy each feedback page of ``course`` (the selected students' and labs') into
    ``out/<student>/<lab>.html`` with its PNG and PDF; return the files written.

    Raises:
        FileNotFoundError: ``course`` has no feedback pages for the selection (grade it first).
    """
    pages = sorted(Path(course).glob("feedback/*/*/*.html"))
    chosen = [
        page
        for page in pages
        if page.stem == page.parent.name
        and (not students or page.parent.parent.name in students)
        and (not labs or any(page.stem.startswith(lab) for lab in labs))
    ]
    if not chosen:
        raise FileNotFoundError(
            f"{course}/feedback holds no feedback page for students={students or 'all'}, "
            f"labs={labs or 'all'}: run `transformer-lab labs grade --course {course}` first"
        )
    written: list[Path] = []
    for page in chosen:
        student, lab = page.parent.parent.name, page.stem
        folder = Path(out) / student
        folder.mkdir(parents=True, exist_ok=True)
        html = folder / f"{lab}.html"
        shutil.copyfile(page, html)
        written.append(html)
        written += screenshot(html, folder / f"{lab}.png", folder / f"{lab}.pdf")
    return written
