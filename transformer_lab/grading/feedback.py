"""Feedback a student can read: which checks failed and why, never the hidden tests' code.

From a submission's executed notebook and its final scores, :func:`feedback_notebook` builds the
notebook the student gets back, and :func:`render_html` its one self-contained HTML page:

* a summary at the top: autograded points, the status (and, for a flagged submission, that an
  instructor will review it), the written answers still to be graded by hand, and a table of
  the checks that did not pass (check, points lost, the first line of the grader's message),
  each linking to its cell, so a student need not scroll the page to find the first one;
* every test cell followed by its points and the grader's message; a **hidden** test cell shows
  only its first line (what it checks and its points), never its code or seeds;
* errors keep their message (the line that names the mistake) but lose the traceback, which
  would show the checks' source;
* a hidden cell shows no output at all, and every cell after the first hidden test cell loses
  its outputs for a one-line note: a later cell could print IPython's history (``In``, ``_ih``)
  or what a check left behind;
* figures stay (the written questions refer to "your curves").

The page is built from an allow-list (:mod:`transformer_lab.grading.inert`), because everything
in a submission, including any text the grader quotes from it, is the student's:

* what the grader writes (summary, table, points, messages) is HTML built here from **escaped
  plain text**, never markdown: a message quoting a student's ``AssertionError`` shows its
  ``![](...)`` or ``**12 / 12 points: passed**`` as the characters they are;
* every markdown cell is rendered first and sanitised after (:func:`inert.markdown_html`), the
  kit's prose included (a "locked" cell's metadata is the student's to forge); a raw cell is
  shown as text;
* outputs keep only plain text, PNG, JPEG and sanitised HTML, with validated sizes as their
  only metadata, and ANSI colours on a fixed palette (:func:`inert.safe_output`);
* the page carries a Content-Security-Policy that lets nothing run or load (only inline styles
  and ``data:`` images), and nbconvert's template scripts are removed.

In the notebook :func:`feedback_notebook` returns, a raw cell holds the page's own HTML (written
here); :func:`render_html` copies raw cells into the page as they are, markdown cells not at all.

Reference: nbconvert's ``HTMLExporter``; MathML Core (W3C); CSP Level 3 (W3C).
"""

from __future__ import annotations

import copy
import functools
import html
import re
from typing import Any

import nbformat
from nbconvert.preprocessors import CoalesceStreamsPreprocessor
from nbformat import NotebookNode

from transformer_lab.grading.inert import (
    fixed_palette,
    markdown_html,
    math_to_mathml,
    safe_output,
    sanitize_html,
)

__all__ = [
    "CONTENT_POLICY",
    "failed_checks",
    "feedback_notebook",
    "math_to_mathml",
    "render_html",
    "sanitize_html",
]

_CSS = """
<style>
  body { max-width: 1100px; margin: 0 auto; }
  pre, .jp-OutputArea-output pre, .output_text pre, code {
    white-space: pre-wrap !important; word-break: break-word; overflow-wrap: anywhere;
  }
  .tl-summary, .tl-result { padding: 0.4em 0 0.4em 6.5em; }
  .tl-result { display: flex; gap: 0.6em; align-items: baseline; }
  .tl-points { font-weight: 600; padding: 0.3em 0.6em; border-radius: 4px; white-space: nowrap; }
  .tl-pass { background: #e6f4ea; } .tl-fail { background: #fdecea; }
  .tl-message { white-space: pre-wrap; overflow-wrap: anywhere; }
  .tl-failed { border-collapse: collapse; margin: 0.6em 0; }
  .tl-failed th, .tl-failed td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left;
    vertical-align: top; }
  .tl-failed td.tl-lost { text-align: right; white-space: nowrap; }
  .tl-student, .tl-raw { padding-left: 6.5em; }
  math { font-size: 1.05em; }
  img { max-width: 100%; }
</style>
"""
#: Nothing on a feedback page may run or load: inline styles and inline images only.
CONTENT_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; font-src data:; "
    "form-action 'none'; base-uri 'none'"
)
HIDDEN_MARK = "### BEGIN HIDDEN TESTS"
AFTER_HIDDEN_NOTE = (
    "(outputs after the first hidden check are not shown in feedback: your points and the "
    "grader's messages are)\n"
)
_PAGE_CELL = "transformer_lab_page"  # metadata key of a raw cell this module wrote


def _page_cell(markup: str) -> NotebookNode:
    """A raw cell holding HTML this module built (copied into the page as it is)."""
    cell = nbformat.v4.new_raw_cell(markup)
    cell.metadata["raw_mimetype"] = "text/html"
    cell.metadata[_PAGE_CELL] = True
    return cell


def _plain(text: str) -> str:
    """Plain text as HTML: escaped; a judge's `name` set in <code> (of the escaped text)."""
    return re.sub(r"`([^`\n]+)`", r"<code>\1</code>", html.escape(text))


def _anchor(grade_id: str) -> str:
    """The page's id for a check's cell (grade ids are the kit's; kept to [A-Za-z0-9_-])."""
    return "check-" + re.sub(r"[^A-Za-z0-9_-]", "-", grade_id)


def _meta(cell: NotebookNode) -> dict:
    meta = cell.get("metadata", {}).get("nbgrader")
    return meta if isinstance(meta, dict) else {}


def _message_only(output: NotebookNode) -> NotebookNode:
    """An error output reduced to one line, its name and message (no traceback, no source)."""
    ename = fixed_palette(str(output.get("ename", "Error")))
    evalue = fixed_palette(str(output.get("evalue", "")))
    return nbformat.v4.new_output(
        "error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"]
    )


def _points_html(score: float, maximum: float, note: str = "") -> str:
    ok = score >= maximum and maximum > 0
    label = "passed" if ok else "did not pass"
    box = (
        f'<span class="tl-points {"tl-pass" if ok else "tl-fail"}">'
        f"{score:g} / {maximum:g} point{'s' * (maximum != 1)}: {label}</span>"
    )
    message = f'<div class="tl-message">{_plain(note)}</div>' if note else ""
    return f'<div class="tl-result">{box}{message}</div>'


def failed_checks(
    order: list[str], scores: dict[str, tuple[float, float]], notes: dict[str, str]
) -> list[tuple[str, float, str]]:
    """``(grade id, points lost, first line of the message)`` of each check that lost points,
    in the notebook's order (``order``: the test cells' grade ids as they appear)."""
    rows = []
    for gid in order:
        score, maximum = scores[gid]
        if score < maximum:
            first = (notes.get(gid) or "").strip().splitlines()
            rows.append((gid, maximum - score, first[0] if first else ""))
    return rows


def _summary_html(
    title: str, status: str, earned: float, possible: float, manual: int, failed: list
) -> str:
    parts = [
        f"<h1>Feedback: {html.escape(title)}</h1>",
        f"<p><strong>Autograded points: {earned:g} / {possible:g}.</strong></p>",
    ]
    if manual:
        parts.append(f"<p>Your {manual} written answer(s) are graded by hand.</p>")
    if status == "flagged":
        parts.append(
            "<p><strong>This submission was flagged for review</strong>: the grader found code "
            "that changes how the checks run or what they use. An instructor will look at it; "
            "the points above are withheld until then.</p>"
        )
    elif status in ("incomplete", "crashed"):
        parts.append(
            f"<p><strong>Grading was {html.escape(status)}</strong>: some cells did not run to "
            "the end (see below). If your code is correct, ask your instructor to grade it "
            "again.</p>"
        )
    if not failed and possible > 0 and status != "flagged":
        parts.append("<p>Every check passed.</p>")
    if failed:
        withheld = "(withheld until the review)" if status == "flagged" else ""
        rows = "".join(
            f'<tr><td><a href="#{_anchor(gid)}"><code>{html.escape(gid)}</code></a></td>'
            f'<td class="tl-lost">{lost:g}</td><td>{_plain(first or withheld)}</td></tr>'
            for gid, lost, first in failed
        )
        parts.append(
            f"<h2>Checks that did not pass ({len(failed)})</h2>"
            '<table class="tl-failed"><thead><tr><th>Check</th><th>Points lost</th>'
            f"<th>What the grader said</th></tr></thead><tbody>{rows}</tbody></table>"
        )
    return f'<div class="tl-summary">{"".join(parts)}</div>'


def feedback_notebook(
    executed: NotebookNode,
    scores: dict[str, tuple[float, float]],
    *,
    title: str,
    status: str,
    notes: dict[str, str] | None = None,
    flags: list[str] | None = None,
) -> NotebookNode:
    """The notebook a student receives as feedback (see the module docstring).

    Args:
        executed: the autograded (executed) notebook.
        scores: test cell grade id -> (points earned, points possible), as recorded.
        title: e.g. ``"Lab 01 (01_positional_encoding), student alice"``.
        status: the submission's status (``graded``, ``incomplete``, ``crashed``, ``flagged``).
        notes: test cell grade id -> the grader's message shown next to its points.
        flags: why the submission was flagged (shown as "will be reviewed", not in detail).
    """
    notes = notes or {}
    # One output per stream run: how the kernel's prints were split into messages depends on
    # timing, and must not change the page (the same grading gives the same feedback).
    nb, _ = CoalesceStreamsPreprocessor().preprocess(copy.deepcopy(executed), {})
    manual = sum(
        1
        for c in nb.cells
        if _meta(c).get("grade") and _meta(c).get("solution") and c.cell_type == "markdown"
    )
    cells, order = [], []
    after_hidden = False
    for cell in nb.cells:
        if cell.get("metadata", {}).get("transformer_lab_finish"):
            continue
        if cell.cell_type == "markdown":
            cells.append(_page_cell(f'<div class="tl-student">{markdown_html(cell.source)}</div>'))
            continue
        if cell.cell_type != "code":  # a raw cell: its text, never its markup
            cells.append(_page_cell(f'<pre class="tl-raw">{html.escape(cell.source)}</pre>'))
            continue
        meta = _meta(cell)
        gid = meta.get("grade_id")
        graded = bool(meta.get("grade")) and gid in scores and gid not in order
        if graded:
            order.append(gid)
            cells.append(_page_cell(f'<a id="{_anchor(gid)}"></a>'))
        hidden = HIDDEN_MARK in cell.source
        # A hidden cell's only feedback is the grader's message, next to its points.
        cell.outputs = [] if hidden else _feedback_outputs(cell.get("outputs", []), after_hidden)
        if hidden:
            head = cell.source.split(HIDDEN_MARK)[0].rstrip()
            cell.source = head + "\n# (a hidden check: its code is not shown)"
        after_hidden |= hidden
        # Of a code cell's metadata the page uses tags (as classes) and nothing we need.
        cell.metadata = {"nbgrader": copy.deepcopy(meta)} if meta else {}
        count = cell.get("execution_count")
        cell.execution_count = count if type(count) is int else None
        cells.append(cell)
        if graded:
            cells.append(_page_cell(_points_html(*scores[gid], notes.get(gid, ""))))
    earned = sum(s for s, _ in scores.values())
    possible = sum(m for _, m in scores.values())
    failed = failed_checks(order, scores, notes)
    summary = _summary_html(title, status, earned, possible, manual, failed)
    nb.cells = [_page_cell(summary), *cells]
    for number, cell in enumerate(nb.cells):  # the same page for the same grading, anywhere
        if cell.metadata.get(_PAGE_CELL):
            cell.id = f"feedback-{number}"
    # The notebook's own metadata (widget state, title) is the student's: the page needs none.
    nb.metadata = nbformat.from_dict({"language_info": {"name": "python"}})
    return nb


def _feedback_outputs(outputs: list[NotebookNode], withheld: bool) -> list[NotebookNode]:
    """What a code cell shows in feedback: errors as their message, inert displays; or a note.

    ``withheld``: the cell comes after the first hidden test cell; its outputs become one line
    (none if it had none).
    """
    if withheld:
        return [nbformat.v4.new_output("stream", name="stdout", text=AFTER_HIDDEN_NOTE)] * bool(
            outputs
        )
    kept = []
    for output in outputs:
        kind = output.get("output_type")
        if kind == "error":
            kept.append(_message_only(output))
        elif kind == "stream":
            name = "stderr" if output.get("name") == "stderr" else "stdout"
            text = output.get("text", "")
            text = "".join(text) if isinstance(text, list) else str(text)
            kept.append(nbformat.v4.new_output("stream", name=name, text=fixed_palette(text)))
        elif kind in ("display_data", "execute_result"):
            safe = safe_output(output)
            if safe is not None:
                kept.append(safe)
    return kept


@functools.cache
def _html_exporter() -> Any:
    """nbconvert's exporter with JupyterLab's template, built once per process.

    Raw cells are copied as they are (nbconvert's bleach pass would escape MathML and tables):
    every raw cell of a feedback notebook is the page's own HTML (see :func:`_inert_cells`).
    Building it loads and compiles the Jinja templates (about a second); a grading worker
    renders many submissions with the same one.
    """
    from nbconvert import HTMLExporter

    return HTMLExporter(template_name="lab", filters={"clean_html": lambda text: text})


def _inert_cells(nb: NotebookNode) -> NotebookNode:
    """``nb`` where only this module's raw cells stay HTML: any other raw or markdown cell
    becomes its inert form, so nothing reaches the page unsanitised whoever built ``nb``."""
    nb = copy.copy(nb)
    cells = []
    for cell in nb.cells:
        inert = cell
        if cell.cell_type == "markdown":
            inert = _page_cell(markdown_html(cell.source))
        elif cell.cell_type == "raw" and not cell.get("metadata", {}).get(_PAGE_CELL):
            inert = _page_cell(f'<pre class="tl-raw">{html.escape(cell.source)}</pre>')
        if inert is not cell and "id" in cell:  # the same page for the same notebook
            inert.id = cell.id
        cells.append(inert)
    nb.cells = cells
    return nb


def render_html(nb: NotebookNode) -> str:
    """One self-contained HTML page of ``nb``: images inline, MathML, wrapped messages, and a
    policy under which nothing runs or loads (template scripts removed)."""
    body, _ = _html_exporter().from_notebook_node(_inert_cells(nb))
    body = re.sub(r"<script\b.*?</script\s*>", "", body, flags=re.S | re.I)
    body = re.sub(r"<link\b[^>]*>", "", body, flags=re.I)
    policy = f'<meta http-equiv="Content-Security-Policy" content="{CONTENT_POLICY}">'
    body = re.sub(r"<head>", lambda m: m.group(0) + "\n" + policy, body, count=1, flags=re.I)
    return body.replace("</head>", _CSS + "</head>", 1)
