"""Feedback a student can read: which checks failed and why, never the hidden tests' code.

From a submission's executed notebook and its final scores, :func:`feedback_notebook` builds the
notebook the student gets back:

* a summary at the top: autograded points, the status (and, for a flagged submission, that an
  instructor will review it), and the written answers still to be graded by hand;
* every test cell followed by its points; a **hidden** test cell shows only its first line (what
  it checks and its points) and, if it failed, the check's message, never its code or seeds;
* errors keep their message (the line that names the mistake) but lose the traceback, which
  would show the checks' source;
* a hidden cell shows no output at all (its message is the grader's, next to its points), and
  every cell after the first hidden test cell loses its outputs for a one-line note: a later
  cell could print IPython's history (``In``, ``_ih``) or what a check left behind;
* figures stay (the written questions refer to "your curves"): PNG and JPEG images, plain text,
  and HTML **sanitised** by nh3 (:func:`sanitize_html`: no script, no event handler, no style or
  class to dress up as the grader's score boxes, no external resource, only ``data:`` images).
  Other output types (JavaScript, SVG, widgets, Markdown, LaTeX) are dropped. Every markdown cell
  the student could have written (all but the locked ones) is sanitised the same way.

:func:`render_html` turns it into one self-contained HTML file: math converted to MathML (read
by every current browser, offline; no MathJax from a CDN), long messages wrapped, images inline.

Reference: nbconvert's ``HTMLExporter``; MathML Core (W3C); nh3 (Python binding of ammonia).
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

__all__ = ["feedback_notebook", "math_to_mathml", "render_html", "sanitize_html"]

_CSS = """
<style>
  body { max-width: 1100px; margin: 0 auto; }
  pre, .jp-OutputArea-output pre, .output_text pre, code {
    white-space: pre-wrap !important; word-break: break-word; overflow-wrap: anywhere;
  }
  .tl-points { font-weight: 600; padding: 0.3em 0.6em; border-radius: 4px; }
  .tl-pass { background: #e6f4ea; } .tl-fail { background: #fdecea; }
  math { font-size: 1.05em; }
  img { max-width: 100%; }
</style>
"""


#: What a student's HTML may keep: text structure and tables (pandas), ``data:`` images, MathML.
_TEXT_TAGS = {
    *("a", "b", "i", "em", "strong", "code", "pre", "kbd", "samp", "var", "sub", "sup"),
    *("p", "br", "hr", "span", "div", "ul", "ol", "li", "dl", "dt", "dd", "blockquote"),
    *("table", "thead", "tbody", "tfoot", "tr", "th", "td", "caption", "img"),
}
_MATHML_TAGS = {
    *("math", "mi", "mn", "mo", "ms", "mtext", "mspace", "mrow", "mfrac", "msqrt", "mroot"),
    *("msub", "msup", "msubsup", "munder", "mover", "munderover", "mtable", "mtr", "mtd"),
    *("mstyle", "mpadded", "mphantom", "menclose", "semantics", "annotation"),
}
_ATTRIBUTES = {
    "img": {"src", "alt", "width", "height"},
    "td": {"colspan", "rowspan"},
    "th": {"colspan", "rowspan"},
    "math": {"display", "xmlns"},
    "mo": {"stretchy", "fence", "separator", "lspace", "rspace", "form"},
    "mi": {"mathvariant"},
    "mtable": {"columnalign"},
    "mstyle": {"displaystyle", "scriptlevel"},
    "mspace": {"width"},
    "annotation": {"encoding"},
}
#: Output types a student's cell keeps in feedback (HTML only after :func:`sanitize_html`).
_KEPT_MIMETYPES = ("text/plain", "image/png", "image/jpeg", "text/html")
HIDDEN_MARK = "### BEGIN HIDDEN TESTS"
AFTER_HIDDEN_NOTE = (
    "(outputs after the first hidden check are not shown in feedback: your points and the "
    "grader's messages are)\n"
)


def sanitize_html(text: str) -> str:
    """``text`` with only inert HTML left: see the module docstring (nh3, i.e. ammonia).

    Links keep their text and lose their target unless it is a ``data:`` URL; nothing can run
    (no script, no ``on*`` attribute), load anything from elsewhere, or borrow the grader's
    styles (no ``class``, ``id`` or ``style``).
    """
    import nh3

    return nh3.clean(
        text,
        tags=_TEXT_TAGS | _MATHML_TAGS,
        attributes=_ATTRIBUTES,
        url_schemes={"data"},
        link_rel="noopener noreferrer nofollow",
        strip_comments=True,
    )


def _safe_output(output: NotebookNode) -> NotebookNode | None:
    """A display or result output reduced to the kept types (HTML sanitised), or None."""
    data = output.get("data", {})
    kept = {k: v for k, v in data.items() if k in _KEPT_MIMETYPES}
    if "text/html" in kept:
        html_text = kept["text/html"]
        kept["text/html"] = sanitize_html(
            "".join(html_text) if isinstance(html_text, list) else str(html_text)
        )
    if not kept:
        return None
    output = copy.deepcopy(output)
    output["data"] = kept
    output.get("metadata", {}).pop("text/html", None)
    return output


def _safe_markdown(source: str) -> str:
    """A markdown cell the student could have written: math to MathML, then sanitised.

    Code spans and fenced blocks are left as they are: markdown renders them as escaped text.
    """
    parts = re.split(r"(```.*?```|`[^`\n]*`)", source, flags=re.S)
    return "".join(
        part if i % 2 else sanitize_html(math_to_mathml(part)) for i, part in enumerate(parts)
    )


def _meta(cell: NotebookNode) -> dict:
    meta = cell.get("metadata", {}).get("nbgrader")
    return meta if isinstance(meta, dict) else {}


def _tex(expression: str, display: bool) -> str:
    try:
        from latex2mathml.converter import convert
    except ImportError:  # the optional converter is missing: show the TeX as code
        return f"<code>{html.escape(expression)}</code>"
    try:
        return convert(expression, display="block" if display else "inline")
    except Exception:  # an expression the converter does not know: keep it readable
        return f"<code>{html.escape(expression)}</code>"


def math_to_mathml(markdown: str) -> str:
    """Replace ``$$...$$`` and ``$...$`` (outside code) by MathML."""
    parts = re.split(r"(```.*?```|`[^`\n]*`)", markdown, flags=re.S)
    out = []
    for i, part in enumerate(parts):
        if i % 2:  # code: untouched
            out.append(part)
            continue
        part = re.sub(r"\$\$(.+?)\$\$", lambda m: _tex(m.group(1).strip(), True), part, flags=re.S)
        part = re.sub(r"(?<![\\$])\$([^$\n]+?)\$", lambda m: _tex(m.group(1), False), part)
        out.append(part)
    return "".join(out)


def _message_only(output: NotebookNode) -> NotebookNode:
    """An error output reduced to its name and message (no traceback, no source lines)."""
    evalue = str(output.get("evalue", ""))
    return nbformat.v4.new_output(
        "error", ename=output.get("ename", "Error"), evalue=evalue, traceback=[]
    )


def _points_cell(score: float, maximum: float, note: str = "") -> NotebookNode:
    ok = score >= maximum and maximum > 0
    label = "passed" if ok else "did not pass"
    text = (
        f'<span class="tl-points {"tl-pass" if ok else "tl-fail"}">'
        f"{score:g} / {maximum:g} point{'s' * (maximum != 1)}: {label}</span>"
    )
    if note:
        text += f" {html.escape(note)}"
    return nbformat.v4.new_markdown_cell(text)


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
        notes: test cell grade id -> a sentence shown next to its points.
        flags: why the submission was flagged (shown as "will be reviewed", not in detail).
    """
    notes = notes or {}
    # One output per stream run: how the kernel's prints were split into messages depends on
    # timing, and must not change the page (the same grading gives the same feedback).
    nb, _ = CoalesceStreamsPreprocessor().preprocess(copy.deepcopy(executed), {})
    earned = sum(s for s, _ in scores.values())
    possible = sum(m for _, m in scores.values())
    manual = sum(
        1
        for c in nb.cells
        if _meta(c).get("grade") and _meta(c).get("solution") and c.cell_type == "markdown"
    )
    summary = [
        f"# Feedback: {html.escape(title)}",
        "",
        f"**Autograded points: {earned:g} / {possible:g}.**",
    ]
    if manual:
        summary.append(f"Your {manual} written answer(s) are graded by hand.")
    if status == "flagged":
        summary.append(
            "**This submission was flagged for review**: the grader found code that changes how "
            "the checks run or what they use. An instructor will look at it; the points above are "
            "withheld until then."
        )
    elif status in ("incomplete", "crashed"):
        summary.append(
            f"**Grading was {status}**: some cells did not run to the end (see below). If your "
            "code is correct, ask your instructor to grade it again."
        )
    cells = [nbformat.v4.new_markdown_cell("\n\n".join(summary), id="feedback-summary")]
    after_hidden = False
    for cell in nb.cells:
        if cell.get("metadata", {}).get("transformer_lab_finish"):
            continue
        meta = _meta(cell)
        if cell.cell_type == "markdown":
            trusted = meta.get("locked") and not meta.get("solution")
            cell.source = math_to_mathml(cell.source) if trusted else _safe_markdown(cell.source)
            cells.append(cell)
            continue
        if cell.cell_type != "code":
            if cell.cell_type == "raw":  # raw HTML would be copied into the page as it is
                cell.metadata.pop("raw_mimetype", None)
                cell.metadata.pop("format", None)
            cells.append(cell)
            continue
        hidden = HIDDEN_MARK in cell.source
        # A hidden cell's only feedback is the grader's message, next to its points.
        cell.outputs = [] if hidden else _feedback_outputs(cell.get("outputs", []), after_hidden)
        if hidden:
            head = cell.source.split(HIDDEN_MARK)[0].rstrip()
            cell.source = head + "\n# (a hidden check: its code is not shown)"
        after_hidden |= hidden
        cells.append(cell)
        gid = meta.get("grade_id")
        if meta.get("grade") and gid in scores:
            cells.append(_points_cell(*scores[gid], notes.get(gid, "")))
            cells[-1].id = f"points-{gid}"[:64]  # the same page for the same grading, anywhere
    nb.cells = cells
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
            kept.append(output)
        elif kind in ("display_data", "execute_result"):
            safe = _safe_output(output)
            if safe is not None:
                kept.append(safe)
    return kept


@functools.cache
def _html_exporter() -> Any:
    """nbconvert's exporter with JupyterLab's template, built once per process.

    Building it loads and compiles the Jinja templates (about a second); a grading worker
    renders many submissions with the same one.
    """
    from nbconvert import HTMLExporter

    return HTMLExporter(template_name="lab")


def render_html(nb: NotebookNode) -> str:
    """One self-contained HTML page of ``nb``: images inline, MathML, wrapped messages."""
    body, _ = _html_exporter().from_notebook_node(nb)
    body = re.sub(r"<script[^>]*mathjax[^>]*>\s*</script>", "", body, flags=re.I)
    body = re.sub(r"<script[^>]*>[^<]*MathJax[^<]*</script>", "", body, flags=re.S)
    return body.replace("</head>", _CSS + "</head>", 1)
