"""``transformer-lab labs report --course COURSE [LAB ...]``: what the class got wrong.

One self-contained HTML page (inline CSS, figures as base64 PNG drawn with matplotlib, no
external asset: it opens offline and can be mailed) and the same tables as CSV:

* ``scores.csv``: the score distribution per lab (count, mean, median, statuses), figure: a
  histogram per lab;
* ``cells.csv``: per test cell, mean points, how many students earned full and zero marks;
* ``mistakes.csv``: which named mistake how many students made ("the mask leaves out the
  diagonal: 14 of 61 students"), each linked to those students' feedback pages; the names come
  from the checks' verdicts (``SubmissionResult.verdicts``, :mod:`~transformer_lab.grading.
  results`); records without verdicts contribute per-cell scores only;
* ``attention.csv``: flagged, incomplete, crashed, unmatched and failed submissions, and
  students whose files ``collect`` could not place (not a notebook, wrong lab, ...), with
  their reasons;
* ``not_placed.csv``: files ``collect`` found no student for (unknown, ambiguous, misnamed);
* ``progress.csv``: each student's score per lab (fraction of the maximum), figure: a heat map.

Every student of the roster (``--roster``, or the one ``collect`` kept) is in it, with their
name beside their id, also those who handed in nothing.
"""

from __future__ import annotations

import base64
import csv
import datetime as dt
import html
import io
import os
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from transformer_lab.grading.lms import Roster
from transformer_lab.grading.results import Outcome, course_outcomes, neutralise, unplaced_files

__all__ = ["write_report"]

ATTENTION = ("flagged", "incomplete", "crashed", "unmatched", "failed")
CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;padding:0 1em;max-width:74em;color:#222}
table{border-collapse:collapse;margin:1em 0;max-width:100%;font-size:.9em}
td,th{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top;
overflow-wrap:break-word}th{background:#f2f2f2}td.n{text-align:right;white-space:nowrap}
h2{border-bottom:2px solid #ddd;margin-top:2em}img{max-width:100%}.muted{color:#777}
.flagged,.lost{color:#a00}.incomplete,.crashed{color:#a60}.missing{color:#999}
"""


def _png(fig: Any) -> str:
    """A matplotlib figure as an inline ``<img>`` (base64 PNG); the figure is closed."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img alt="figure" src="data:image/png;base64,{data}">'


def _auto(o: Outcome) -> tuple[float, float]:
    """Autograded points and their maximum (the written answers, graded by hand, apart)."""
    return o.score - o.manual_score, o.max_score - o.manual_max


def _fraction(o: Outcome) -> float | None:
    """The autograded fraction: written answers not graded yet do not lower it."""
    score, top = _auto(o)
    return score / top if top and o.status != "missing" else None


def _points(o: Outcome) -> str:
    """``12/12 + 3/6 written (1 to grade)``: autograded and manual points apart."""
    score, top = _auto(o)
    text = f"{score:g}/{top:g}"
    if o.manual_max:
        text += f" + {o.manual_score:g}/{o.manual_max:g} written"
        text += f" ({o.needs_manual} to grade)" if o.needs_manual else ""
    return text


def _distribution_rows(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    rows = []
    for lab in sorted({o.lab for o in outcomes}):
        mine = [o for o in outcomes if o.lab == lab]
        handed = [o for o in mine if o.status != "missing"]
        scores = [o.score for o in handed]
        auto = [_auto(o)[0] for o in handed]
        row: dict[str, Any] = {
            "lab": lab,
            "students": len(mine),
            "submitted": len(handed),
            "max_score": max((o.max_score for o in mine), default=0.0),
            "mean": round(statistics.fmean(scores), 2) if scores else "",
            "median": round(statistics.median(scores), 2) if scores else "",
            "auto_max": max((_auto(o)[1] for o in mine), default=0.0),
            "auto_mean": round(statistics.fmean(auto), 2) if auto else "",
            "written_max": max((o.manual_max for o in mine), default=0.0),
        }
        for status in ("graded", *ATTENTION, "missing"):
            row[status] = sum(o.status == status for o in mine)
        row["not placed"] = sum(o.status not in ("graded", *ATTENTION, "missing") for o in mine)
        row["written_answers_ungraded"] = sum(o.needs_manual > 0 for o in handed)
        rows.append(row)
    return rows


def _cell_rows(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    cells: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for o in outcomes:
        for gid, verdict in o.cells.items():
            cells[(o.lab, gid)].append(verdict)
    rows = []
    for (lab, gid), verdicts in sorted(cells.items()):
        top = max(float(v.get("max_score", 0.0)) for v in verdicts)
        scores = [float(v.get("score", 0.0)) for v in verdicts]
        rows.append(
            {
                "lab": lab,
                "test_cell": gid,
                "max_score": top,
                "students": len(scores),
                "mean": round(statistics.fmean(scores), 2),
                "full_marks": sum(s >= top for s in scores),
                "zero": sum(s <= 0 for s in scores),
            }
        )
    return rows


def _mistake_rows(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    """One row per (lab, named mistake): the students who made it, in which test cells."""
    found: dict[tuple[str, str], dict[str, Outcome]] = defaultdict(dict)
    cells: dict[tuple[str, str], list[str]] = defaultdict(list)
    messages: dict[tuple[str, str], str] = {}
    for o in outcomes:
        for gid, verdict in o.cells.items():
            if verdict.get("mistake"):
                key = (o.lab, str(verdict["mistake"]))
                found[key][o.student] = o
                if gid not in cells[key]:
                    cells[key].append(gid)
                messages.setdefault(key, str(verdict.get("message", "")))
    handed: dict[str, int] = defaultdict(int)
    for o in outcomes:
        handed[o.lab] += o.status != "missing"
    rows = []
    for key, who in sorted(found.items(), key=lambda kv: (kv[0][0], -len(kv[1]), kv[0][1])):
        lab, mistake = key
        rows.append(
            {
                "lab": lab,
                "mistake": mistake,
                "students": len(who),
                "of": handed[lab],
                "test_cells": " ".join(cells[key]),
                "message": messages[key],
                "who": list(who.values()),
                "student_ids": " ".join(sorted(who)),
            }
        )
    return rows


def _attention_rows(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    return [
        {
            "lab": o.lab,
            "student": o.student,
            "name": o.name,
            "status": o.status,
            "reasons": " | ".join(o.reasons) or "-",
            "outcome": o,
        }
        for o in outcomes
        if o.status not in ("graded", "missing")
    ]


def _progress_rows(outcomes: list[Outcome]) -> tuple[list[str], list[dict[str, Any]]]:
    labs = sorted({o.lab for o in outcomes})
    table: dict[str, dict[str, Any]] = defaultdict(dict)
    for o in outcomes:
        frac = _fraction(o)
        table[o.student][o.lab] = "" if frac is None else round(frac, 3)
        table[o.student][f"{o.lab} status"] = o.status
        table[o.student][f"{o.lab} points"] = _points(o) if frac is not None else ""
    names = {o.student: o.name for o in outcomes}
    rows = [{"student": s, "name": names.get(s, ""), **table[s]} for s in sorted(table)]
    return labs, rows


def _histograms(outcomes: list[Outcome], labs: list[str]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(labs), figsize=(3.2 * len(labs), 2.4), squeeze=False)
    for ax, lab in zip(axes[0], labs, strict=True):
        fracs = [f for o in outcomes if o.lab == lab and (f := _fraction(o)) is not None]
        ax.hist([100 * f for f in fracs], bins=10, range=(0, 100), color="#4c72b0")
        ax.set_title(lab, fontsize=9)
        ax.set_xlabel("% of the autograded maximum", fontsize=8)
        ax.set_ylabel("students", fontsize=8)
    return _png(fig)


def _cell_chart(cell_rows: list[dict[str, Any]]) -> str:
    import matplotlib.pyplot as plt

    names = [f"{r['lab'][:2]} {r['test_cell']}" for r in cell_rows]
    means = [100 * r["mean"] / r["max_score"] if r["max_score"] else 0 for r in cell_rows]
    fig, ax = plt.subplots(figsize=(7, 0.22 * len(names) + 0.8))
    ax.barh(names[::-1], means[::-1], color="#55a868")
    ax.set_xlim(0, 100)
    ax.set_xlabel("mean % of the cell's points", fontsize=8)
    ax.tick_params(labelsize=7)
    return _png(fig)


def _progress_chart(labs: list[str], rows: list[dict[str, Any]]) -> str:
    import matplotlib.pyplot as plt
    import numpy as np

    grid = np.array(
        [[r.get(lab) if r.get(lab) != "" else np.nan for lab in labs] for r in rows], dtype=float
    )
    fig, ax = plt.subplots(figsize=(1.2 * len(labs) + 2, 0.22 * len(rows) + 1))
    image = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0, vmax=1)
    ax.set_xticks(range(len(labs)), [lab[:2] for lab in labs], fontsize=8)
    ax.set_yticks(range(len(rows)), [r["student"] for r in rows], fontsize=7)
    fig.colorbar(image, ax=ax, label="autograded fraction (blank: nothing graded)")
    return _png(fig)


def _head_count(outcomes: list[Outcome], lost: list[dict[str, Any]]) -> str:
    """``20 students, 3 of them handed in nothing for some lab, 2 files placed for nobody``."""
    students = {o.student for o in outcomes}
    nothing = {o.student for o in outcomes if o.status == "missing"}
    return (
        f"{len(students)} students ({len(nothing)} handed in nothing for some lab), "
        f"{len(lost)} file(s) placed for no student"
    )


def _progress_cell(labs: list[str]) -> Any:
    """A lab's cell: the fraction, or the status where nothing was graded."""

    def cell(row: dict[str, Any], column: str) -> str | None:
        if column in labs and row.get(column, "") == "":
            status = str(row.get(f"{column} status", ""))
            shown = "nothing handed in" if status == "missing" else status
            return f'<td class="missing">{html.escape(shown)}</td>'
        if column in labs:
            return f"<td>{html.escape(str(row.get(f'{column} points', '')))}</td>"
        return None

    return cell


def _link(o: Outcome, page: Path) -> str:
    name = html.escape(o.student)
    if o.feedback is None:
        return name
    href = html.escape(Path(os.path.relpath(o.feedback, page.parent)).as_posix())
    return f'<a href="{href}">{name}</a>'


def _table(rows: list[dict[str, Any]], columns: list[str], cell: Any = None) -> str:
    # Long ids break after "_" (01_<wbr>positional_<wbr>encoding), so tables fit a laptop.
    head = "".join(f"<th>{_breakable(c)}</th>" for c in columns)
    body = []
    for row in rows:
        tds = []
        for c in columns:
            shown = cell(row, c) if cell else None
            if shown is None:
                value = row.get(c, "")
                klass = ' class="n"' if isinstance(value, int | float) else ""
                shown = f"<td{klass}>{_breakable(str(value))}</td>"
            tds.append(shown)
        body.append("<tr>" + "".join(tds) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _breakable(text: str) -> str:
    """``text`` escaped, with a line-break opportunity after each ``_``."""
    return html.escape(text).replace("_", "_<wbr>")


def _write_csv(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore", restval="")
        writer.writeheader()
        writer.writerows({k: neutralise(v) for k, v in row.items() if k in columns} for row in rows)


def write_report(
    course: Path,
    labs: list[str] | None = None,
    out: Path | None = None,
    deadlines: dict[str, dt.datetime] | None = None,
    roster: Roster | None = None,
) -> list[Path]:
    """Write ``index.html`` and the CSV tables into ``out`` (default ``COURSE/report``).

    Returns:
        The files written, the page first.

    Raises:
        GradingError: no gradebook, or a lab it does not know.
    """
    course = Path(course).resolve()
    out = Path(out).resolve() if out else course / "report"
    out.mkdir(parents=True, exist_ok=True)
    page = out / "index.html"
    outcomes = course_outcomes(course, labs, deadlines, roster=roster)
    lost = unplaced_files(course, sorted({o.lab for o in outcomes}))
    dist = _distribution_rows(outcomes)
    cells = _cell_rows(outcomes)
    mistakes = _mistake_rows(outcomes)
    attention = _attention_rows(outcomes)
    lab_names, progress = _progress_rows(outcomes)

    dist_cols = [
        "lab",
        "students",
        "submitted",
        "max_score",
        "mean",
        "median",
        "auto_max",
        "auto_mean",
        "written_max",
        "graded",
        *ATTENTION,
        "missing",
        "not placed",
        "written_answers_ungraded",
    ]
    cell_cols = ["lab", "test_cell", "max_score", "students", "mean", "full_marks", "zero"]
    mistake_cols = ["lab", "mistake", "students", "of", "test_cells", "message", "student_ids"]
    attention_cols = ["lab", "student", "name", "status", "reasons"]
    lost_cols = ["lab", "lms", "file", "lms_id", "kind", "reason"]
    progress_cols = [
        "student",
        "name",
        *lab_names,
        *(f"{lab} status" for lab in lab_names),
        *(f"{lab} points" for lab in lab_names),
    ]
    files = [page]
    for name, rows, cols in (
        ("scores.csv", dist, dist_cols),
        ("cells.csv", cells, cell_cols),
        ("mistakes.csv", mistakes, mistake_cols),
        ("attention.csv", attention, attention_cols),
        ("not_placed.csv", lost, lost_cols),
        ("progress.csv", progress, progress_cols),
    ):
        _write_csv(out / name, rows, cols)
        files.append(out / name)

    def mistake_cell(row: dict[str, Any], column: str) -> str | None:
        if column == "mistake":
            what = html.escape(row["mistake"])
            return f"<td><b>{what}</b>: {row['students']} of {row['of']} students</td>"
        if column == "student_ids":
            return "<td>" + ", ".join(_link(o, page) for o in row["who"]) + "</td>"
        return None

    def attention_cell(row: dict[str, Any], column: str) -> str | None:
        if column == "student":
            return f"<td>{_link(row['outcome'], page)}</td>"
        if column == "status":
            klass = row["status"] if row["status"] in (*ATTENTION, "missing") else "lost"
            return f'<td class="{klass}">{html.escape(row["status"])}</td>'
        return None

    without_verdicts = not any(
        o.cells and any("mistake" in v and v["mistake"] for v in o.cells.values()) for o in outcomes
    )
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>Class report: {html.escape(course.name)}</title><style>{CSS}</style></head><body>",
        f"<h1>Class report: {html.escape(course.name)}</h1>",
        f"<p class='muted'>{_head_count(outcomes, lost)}, labs "
        f"{', '.join(html.escape(lab) for lab in lab_names)}. Tables as CSV beside this page.</p>",
        "<h2>Score distribution per lab</h2>",
        # Two tables (one CSV): points, then what happened to the submissions.
        _table(
            dist, [c for c in dist_cols if c not in ("graded", *ATTENTION, "missing", "not placed")]
        ),
        _table(dist, ["lab", "graded", *ATTENTION, "missing", "not placed"]),
        _histograms(outcomes, lab_names) if lab_names else "",
        "<h2>What the class got wrong</h2>",
        "<p class='muted'>Named mistakes recognised by the checks; each name links to that "
        "student's feedback.</p>",
        _table(mistakes, ["lab", "mistake", "test_cells", "message", "student_ids"], mistake_cell)
        if mistakes
        else "<p>No named mistakes recorded"
        + (" (these grading records carry per-cell scores only)." if without_verdicts else ".")
        + "</p>",
        "<h2>Points per test cell</h2>",
        _table(cells, cell_cols),
        _cell_chart(cells) if cells else "",
        "<h2>Submissions to look at</h2>",
        _table(attention, attention_cols, attention_cell) if attention else "<p>None.</p>",
        "<h2>Files no student could be found for</h2>",
        _table(lost, lost_cols) if lost else "<p>None.</p>",
        "<h2>Each student's progress</h2>",
        "<p class='muted'>Autograded points, then written answers graded by hand (and how many "
        "are still to grade), per lab; the status where nothing was graded. The chart and "
        "progress.csv give the autograded fraction.</p>",
        _progress_chart(lab_names, progress) if progress and lab_names else "",
        _table(progress, ["student", "name", *lab_names], _progress_cell(lab_names)),
        "</body></html>",
    ]
    page.write_text("\n".join(parts), encoding="utf-8")
    return files
