"""``transformer-lab labs build|check|grade``: the instructor's commands.

* ``build [LAB ...]``: regenerate ``labs/`` from ``solutions/`` (a no-op when up to date) and
  the student package ``dist/student/*.whl`` that the setup cells install.
* ``new NN_name --title TITLE``: start a lab from the lab standard (notebook and checks).
* ``check [LAB ...] [--no-grade] [--unsandboxed]``: release in sync, nothing leaked, solution
  gets full marks and the untouched release zero (exit 1 with the reasons otherwise).
* ``grade --course DIR [LAB ...] [--student ID ...] [--jobs N | --cluster ADDRESS] [--resume]
  [--unsandboxed]``: autograde
  ``DIR/submitted`` into ``DIR/gradebook.db`` (each submission in a bubblewrap sandbox; without
  one it refuses unless ``--unsandboxed``), write ``DIR/grades.csv`` (with
  ``status`` and ``flags``), ``DIR/feedback/`` and ``DIR/grading_report.json`` (exit 1 if any
  submission is not cleanly graded: flagged, crashed, incomplete, unmatched or failed; the
  others are graded regardless).
* ``render [LAB ...] --out DIR``: each lab executed with its solution in the student package of
  its deadline, as a notebook, a JupyterLab-style HTML page and (with Chromium) a screenshot;
  with ``--feedback COURSE [--student S]``, the feedback pages of a graded course instead, as
  its students see them.
* ``merge --course DIR GRADEBOOK ...``: merge gradebooks graded on other machines into
  ``DIR/gradebook.db``.
* ``collect --lms moodle|canvas|blackboard|classroom ARCHIVE --lab LAB --course DIR
  [--roster CSV] [--drive-listing JSON]``: an LMS's "download all submissions" into
  ``DIR/submitted`` (every file not placed is named with its reason; exit 1 if any); for
  Classroom, Drive's listing of the folder places each file by its owner.
* ``export --lms moodle|canvas --course DIR [--lab LAB ...] --out OUT``: the LMS's grade
  import CSV and feedback zip; nbgrader's feedback layout completed. ``--lms canvas-api
  --canvas-url URL --canvas-course ID --canvas-assignment LAB=ID [--canvas-grades]
  [--dry-run]``: each feedback page sent as a Canvas comment file, under its ``.html`` name
  (token from ``$CANVAS_API_TOKEN``).
* ``report --course DIR [LAB ...]``: the class report (HTML and CSV) in ``DIR/report``.

Labs are named in full (``01_positional_encoding``) or by prefix (``01``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from transformer_lab.grading.course import BUDGET_S, GradingError, find_repo

if TYPE_CHECKING:
    from transformer_lab.grading.grade import SubmissionResult
    from transformer_lab.grading.lms import Roster

__all__ = ["main"]

UNSANDBOXED_HELP = (
    "grade without the bubblewrap sandbox (untrusted code then runs as you; each submission is "
    "still contained); without this flag grading refuses where bubblewrap does not work"
)


def _sandbox_mode(ns: argparse.Namespace) -> str:
    """``off`` when asked (``--unsandboxed``, ``--sandbox off``), said loudly; else ``required``."""
    if getattr(ns, "unsandboxed", False) or getattr(ns, "sandbox", "required") == "off":
        print("WARNING: --unsandboxed: submissions run WITHOUT the OS sandbox", file=sys.stderr)
        return "off"
    return "required"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="transformer-lab labs", description=__doc__.split("\n")[0])
    p.add_argument("--repo", type=Path, default=None, help="repository root (default: found)")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="regenerate labs/ and the student package from solutions/")
    b.add_argument("labs", nargs="*", help="lab names or prefixes (default: all)")
    b.add_argument("--no-student", action="store_true", help="skip the student package")
    n = sub.add_parser("new", help="start a lab from the lab standard")
    n.add_argument("lab", help="the new lab's folder name, NN_name (e.g. 09_vision_transformer)")
    n.add_argument("--title", required=True, help="the lab's title, e.g. 'Vision Transformers'")
    c = sub.add_parser("check", help="release in sync, no leaks, solution full, release zero")
    c.add_argument("labs", nargs="*")
    c.add_argument("--no-grade", action="store_true", help="skip the nbgrader round trip")
    c.add_argument("--timeout", type=int, default=None, help="seconds per cell")
    c.add_argument("--keep", type=Path, default=None, help="keep the round-trip course here")
    c.add_argument("--unsandboxed", action="store_true", help=UNSANDBOXED_HELP)
    r = sub.add_parser("render", help="each lab executed with its solution, as HTML (and PNG)")
    r.add_argument("labs", nargs="*")
    r.add_argument("--out", type=Path, required=True, help="folder for the .ipynb/.html/.png files")
    r.add_argument("--profile", choices=("grading", "full"), default="grading")
    r.add_argument(
        "--feedback",
        type=Path,
        default=None,
        metavar="COURSE",
        help="render the feedback pages `labs grade` wrote in COURSE (as students see them)",
    )
    r.add_argument("--student", action="append", default=None, help="with --feedback: only this")
    g = sub.add_parser("grade", help="autograde a course folder")
    g.add_argument("--course", type=Path, required=True, help="folder holding submitted/")
    g.add_argument("labs", nargs="*")
    g.add_argument("--student", action="append", default=None, help="only this student")
    g.add_argument("--timeout", type=int, default=None, help="seconds per cell")
    g.add_argument("--jobs", type=int, default=1, help="submissions graded at once")
    g.add_argument("--budget", type=float, default=BUDGET_S, help="seconds per submission")
    g.add_argument("--memory-gb", type=float, default=8.0, help="memory per submission")
    g.add_argument("--tmp-gb", type=float, default=1.0, help="its /tmp (part of --memory-gb)")
    g.add_argument("--max-tasks", type=int, default=256, help="its processes and threads")
    g.add_argument(
        "--grader-memory-gb",
        type=float,
        default=6.0,
        help="memory of the grader's own work on each submission (its child process)",
    )
    g.add_argument("--unsandboxed", action="store_true", help=UNSANDBOXED_HELP)
    g.add_argument(
        "--sandbox",
        choices=("required", "off"),
        default="required",
        help="bubblewrap sandbox: required (the default), off (the same as --unsandboxed)",
    )
    g.add_argument("--keep-work", action="store_true", help="keep the per-submission workspaces")
    g.add_argument(
        "--force", action="store_true", help="grade again also submissions unchanged since graded"
    )
    g.add_argument(
        "--cluster",
        default=None,
        metavar="ADDRESS",
        help="grade on a Dask cluster: tcp://scheduler:8786, a scheduler file (*.json) or "
        "local:N (N worker processes here); docs/grading.md",
    )
    g.add_argument(
        "--resume", action="store_true", help="grade only what a stopped run left ungraded"
    )
    m = sub.add_parser("merge", help="merge gradebooks graded elsewhere into DIR/gradebook.db")
    m.add_argument("--course", type=Path, required=True, help="folder holding gradebook.db")
    m.add_argument("gradebooks", nargs="+", type=Path, help="other gradebook.db files")
    _lms_parsers(sub)
    return p


def _lms_parsers(sub: argparse._SubParsersAction) -> None:
    from transformer_lab.grading.lms import FORMATS

    col = sub.add_parser("collect", help="an LMS's download of all submissions into submitted/")
    col.add_argument("source", type=Path, help="the LMS's zip, or the folder it was unpacked in")
    col.add_argument("--lms", required=True, choices=sorted(FORMATS))
    col.add_argument("--lab", required=True, help="the lab these submissions are for")
    col.add_argument("--course", type=Path, required=True, help="the course folder")
    col.add_argument(
        "--roster", type=Path, default=None, help="id,first_name,last_name,email[,lms_id]"
    )
    col.add_argument("--timezone", default="UTC", help="zone of times written without one")
    col.add_argument(
        "--drive-listing",
        type=Path,
        default=None,
        metavar="JSON",
        help="classroom: the Drive API's files.list of the assignment folder (owners): each "
        "file is placed by its owner's e-mail, not its name (docs/grading.md)",
    )
    ex = sub.add_parser("export", help="grades and feedback for an LMS's import")
    ex.add_argument(
        "--lms",
        required=True,
        choices=("moodle", "canvas", "canvas-api"),
        help="canvas-api: send each feedback page as a Canvas comment file (REST API)",
    )
    ex.add_argument("--course", type=Path, required=True)
    ex.add_argument("--lab", action="append", default=None, help="only this lab (repeatable)")
    ex.add_argument("--out", type=Path, required=True, help="folder for the CSV and zip files")
    ex.add_argument("--roster", type=Path, default=None)
    ex.add_argument(
        "--canvas-assignment",
        action="append",
        default=[],
        metavar="LAB=ID",
        help="Canvas assignment id of a lab (the gradebook column 'LAB (ID)'; canvas-api: "
        "where its comments go)",
    )
    api = ex.add_argument_group("canvas-api (token from $CANVAS_API_TOKEN, never a flag)")
    api.add_argument("--canvas-url", default=None, help="https://canvas.example.edu")
    api.add_argument("--canvas-course", default=None, help="the Canvas course id")
    api.add_argument(
        "--canvas-grades", action="store_true", help="also post each grade (posted_grade)"
    )
    api.add_argument(
        "--dry-run", action="store_true", help="write OUT/canvas-api-plan.json, send nothing"
    )
    api.add_argument(
        "--canvas-token-env",
        default="CANVAS_API_TOKEN",
        metavar="NAME",
        help="the environment variable holding the token (default CANVAS_API_TOKEN)",
    )
    rep = sub.add_parser("report", help="the class report: HTML page and CSV tables")
    rep.add_argument("--course", type=Path, required=True)
    rep.add_argument("labs", nargs="*")
    rep.add_argument("--out", type=Path, default=None, help="default: COURSE/report")
    rep.add_argument(
        "--roster", type=Path, default=None, help="default: the one collect kept in COURSE/lms"
    )


def _lms_command(repo: Path, ns: argparse.Namespace) -> int:
    from transformer_lab.grading.course import select_labs
    from transformer_lab.grading.lms import Roster
    from transformer_lab.grading.results import course_deadlines

    roster = Roster.read(ns.roster) if getattr(ns, "roster", None) else None
    if ns.command == "collect":
        from transformer_lab.grading.lms import collect, save_roster

        done = collect(
            ns.source,
            lms=ns.lms,
            lab=ns.lab,
            course=ns.course,
            repo=repo,
            roster=roster,
            timezone=ns.timezone,
            drive_listing=ns.drive_listing,
        )
        print(done.table())
        print(f"record:    {done.record}")
        if ns.roster is not None:
            print(f"roster:    {save_roster(ns.course, ns.roster)} (grade, report and export list "
                  "every student on it)")  # fmt: skip
        return 1 if done.skipped else 0
    if ns.command == "export":
        from transformer_lab.grading.export import export_grades

        ids = {}
        for item in ns.canvas_assignment:
            lab, sep, number = item.partition("=")
            if not sep or not number.strip().isdigit():
                raise GradingError(f"--canvas-assignment {item!r} is not LAB=NUMBER")
            ids[select_labs(repo, [lab])[0]] = number.strip()
        labs = select_labs(repo, ns.lab) if ns.lab else None
        if ns.lms == "canvas-api":
            return _canvas_api(ns, ids, labs, course_deadlines(repo), roster)
        done = export_grades(
            ns.course,
            ns.lms,
            ns.out,
            labs=labs,
            roster=roster,
            deadlines=course_deadlines(repo),
            assignment_ids=ids,
        )
        for path in done.written:
            print(f"wrote {path}")
        for line in done.left_out:
            print(f"left out: {line}")
        return 0
    from transformer_lab.grading.report import write_report

    labs = select_labs(repo, ns.labs) if ns.labs else None
    files = write_report(ns.course, labs, ns.out, course_deadlines(repo), roster=roster)
    for path in files:
        print(f"wrote {path}")
    return 0


def _canvas_api(
    ns: argparse.Namespace,
    ids: dict[str, str],
    labs: list[str] | None,
    deadlines: dict,
    roster: Roster | None,
) -> int:
    """``export --lms canvas-api``: one line per student; exit 1 if any was not sent."""
    from transformer_lab.grading.canvas_api import CanvasTarget, push_feedback

    for flag, value in (("--canvas-url", ns.canvas_url), ("--canvas-course", ns.canvas_course)):
        if not value:
            raise GradingError(f"--lms canvas-api needs {flag}")
    target = CanvasTarget(ns.canvas_url, str(ns.canvas_course), ids, grades=ns.canvas_grades)
    done, lines = push_feedback(
        ns.course,
        ns.out,
        target,
        labs=labs,
        roster=roster,
        dry_run=ns.dry_run,
        token_env=ns.canvas_token_env,
        deadlines=deadlines,
    )
    for path in done.written:
        print(f"wrote {path}")
    for line in lines:
        print(line)
    for line in done.left_out:
        print(f"left out: {line}")
    failed = sum(line.startswith(("FAILED", "not sent")) for line in lines)
    if failed:
        print(f"{failed} not sent: run the same command again to retry them (the others are "
              "not sent twice)", file=sys.stderr)  # fmt: skip
    return 1 if failed else 0


def main(args: list[str]) -> int:
    """Run a ``labs`` subcommand; return the process exit code."""
    ns = _parser().parse_args(args)
    try:
        repo = find_repo(ns.repo)
        if ns.command == "build":
            return _build(repo, ns.labs, student=not ns.no_student)
        if ns.command == "new":
            from transformer_lab.grading.course import course_settings
            from transformer_lab.grading.standard import new_lab

            for path in new_lab(repo, ns.lab, ns.title, course_settings(repo).kit_source):
                print(f"wrote {path.relative_to(repo)}")
            print(
                f"next: write the lab, then `transformer-lab labs build {ns.lab[:2]}` and "
                f"`transformer-lab labs check {ns.lab[:2]}` (docs/labs.md)"
            )
            return 0
        if ns.command == "check":
            from transformer_lab.grading.check import check_labs

            start = time.perf_counter()
            problems = check_labs(
                repo,
                ns.labs,
                grade=not ns.no_grade,
                timeout=ns.timeout,
                keep=ns.keep,
                sandbox=_sandbox_mode(ns),
            )
            for problem in problems:
                print(f"FAIL {problem}")
            took = time.perf_counter() - start
            summary = f"{len(problems)} problem(s)" if problems else "ok"
            print(f"{summary} ({took:.0f} s)")
            return 1 if problems else 0
        if ns.command == "render":
            from transformer_lab.grading.render import render_feedback, render_labs

            if ns.feedback is not None:
                labs = ns.labs or None
                paths = render_feedback(ns.feedback, ns.out, students=ns.student, labs=labs)
            else:
                paths = render_labs(repo, ns.labs, ns.out, profile=ns.profile)
            for path in paths:
                print(f"wrote {path}")
            return 0
        if ns.command in ("collect", "export", "report"):
            return _lms_command(repo, ns)
        if ns.command == "merge":
            from transformer_lab.grading.grade import merge_gradebooks

            target = ns.course / "gradebook.db"
            if not target.is_file():
                raise GradingError(f"{target} does not exist: grade or generate the labs first")
            for item in merge_gradebooks(target, ns.gradebooks):
                print(f"merged {item}")
            return 0
        from transformer_lab.grading.grade import GradingOptions, grade_course

        options = GradingOptions(
            budget=ns.budget,
            memory_gb=ns.memory_gb,
            grader_memory_gb=ns.grader_memory_gb,
            tmp_gb=ns.tmp_gb,
            max_tasks=ns.max_tasks,
            sandbox=_sandbox_mode(ns),
            keep_work=ns.keep_work,
        )
        report = grade_course(
            ns.course,
            repo,
            ns.labs,
            students=ns.student,
            timeout=ns.timeout,
            jobs=ns.jobs,
            options=options,
            force=ns.force,
            cluster=ns.cluster,
            resume=ns.resume,
            progress=_progress,
        )
        print(report.table())
        from transformer_lab.grading.rubrics import add_rubrics

        # Formgrader shows the autograded notebooks: the written answers' rubrics go beside them.
        add_rubrics(ns.course, repo, sorted({r.lab for r in report.results}))
        print(f"gradebook: {ns.course / 'gradebook.db'}")
        print(f"grades:    {report.csv_path}")
        print(f"feedback:  {report.feedback_dir}")
        return 0 if report.ok else 1
    except (GradingError, FileExistsError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _progress(done: int, total: int, result: SubmissionResult) -> None:
    """One line per finished submission, on standard error (the table comes at the end)."""
    points = ""
    if result.auto_score is not None:
        points = f" {result.auto_score:g}/{result.auto_max or 0:g}"
    line = f"[{done}/{total}] {result.student} {result.lab}: {result.status}{points}"
    print(f"{line} ({result.seconds:.0f} s)", file=sys.stderr, flush=True)


def _build(repo: Path, labs: list[str], *, student: bool) -> int:
    from transformer_lab.grading.build import build_labs, build_student_package
    from transformer_lab.grading.course import course_settings
    from transformer_lab.grading.standard import DEFAULT_KIT_SOURCE

    changed = build_labs(repo, labs, student=False)
    for path in changed:
        print(f"wrote {path}")
    print("labs/ is up to date" if not changed else f"{len(changed)} file(s) updated")
    if student:
        built = build_student_package(repo)
        if built is not None:
            wheel, locked = built
            kit_source = course_settings(repo).kit_source
            print(
                f"student package: {wheel.relative_to(repo)} (answers left out: "
                f"{', '.join(locked) or 'none'})"
            )
            if kit_source == DEFAULT_KIT_SOURCE:
                print(
                    "note: c.TransformerLab.kit_source in nbgrader_config.py is still the "
                    "placeholder; set it to where you publish the student package"
                )
            else:
                print(
                    f"publish {wheel.parent.relative_to(repo)}/ (the wheel and latest.json) at "
                    f"{kit_source}: the labs' setup cells install or upgrade the kit from there"
                )
    return 0
