"""``transformer-lab labs build|check|grade``: the instructor's commands.

* ``build [LAB ...]``: regenerate ``labs/`` from ``solutions/`` (a no-op when up to date) and
  the student package ``dist/student/*.whl`` that the setup cells install.
* ``new NN_name --title TITLE``: start a lab from the lab standard (notebook and checks).
* ``check [LAB ...] [--no-grade] [--unsandboxed]``: release in sync, nothing leaked, solution
  gets full marks and the untouched release zero (exit 1 with the reasons otherwise).
* ``grade --course DIR [LAB ...] [--student ID ...] [--jobs N] [--unsandboxed]``: autograde
  ``DIR/submitted`` into ``DIR/gradebook.db`` (each submission in a bubblewrap sandbox; without
  one it refuses unless ``--unsandboxed``), write ``DIR/grades.csv`` (with
  ``status`` and ``flags``), ``DIR/feedback/`` and ``DIR/grading_report.json`` (exit 1 if any
  submission is not cleanly graded: flagged, crashed, incomplete, unmatched or failed; the
  others are graded regardless).
* ``render [LAB ...] --out DIR``: each lab executed with its solution in the student package of
  its deadline, as a notebook, a JupyterLab-style HTML page and (with Chromium) a screenshot.
* ``merge --course DIR GRADEBOOK ...``: merge gradebooks graded on other machines into
  ``DIR/gradebook.db``.

Labs are named in full (``01_positional_encoding``) or by prefix (``01``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from transformer_lab.grading.course import GradingError, find_repo

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
    g = sub.add_parser("grade", help="autograde a course folder")
    g.add_argument("--course", type=Path, required=True, help="folder holding submitted/")
    g.add_argument("labs", nargs="*")
    g.add_argument("--student", action="append", default=None, help="only this student")
    g.add_argument("--timeout", type=int, default=None, help="seconds per cell")
    g.add_argument("--jobs", type=int, default=1, help="submissions graded at once")
    g.add_argument("--budget", type=float, default=300.0, help="seconds per submission")
    g.add_argument("--memory-gb", type=float, default=8.0, help="memory per submission")
    g.add_argument("--tmp-gb", type=float, default=1.0, help="its /tmp (part of --memory-gb)")
    g.add_argument("--max-tasks", type=int, default=256, help="its processes and threads")
    g.add_argument("--unsandboxed", action="store_true", help=UNSANDBOXED_HELP)
    g.add_argument(
        "--sandbox",
        choices=("required", "off"),
        default="required",
        help="bubblewrap sandbox: required (the default), off (the same as --unsandboxed)",
    )
    g.add_argument("--keep-work", action="store_true", help="keep the per-submission workspaces")
    m = sub.add_parser("merge", help="merge gradebooks graded elsewhere into DIR/gradebook.db")
    m.add_argument("--course", type=Path, required=True, help="folder holding gradebook.db")
    m.add_argument("gradebooks", nargs="+", type=Path, help="other gradebook.db files")
    return p


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
            from transformer_lab.grading.render import render_labs

            for path in render_labs(repo, ns.labs, ns.out, profile=ns.profile):
                print(f"wrote {path}")
            return 0
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
        )
        print(report.table())
        print(f"gradebook: {ns.course / 'gradebook.db'}")
        print(f"grades:    {report.csv_path}")
        print(f"feedback:  {report.feedback_dir}")
        return 0 if report.ok else 1
    except (GradingError, FileExistsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


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
                print(f"publish it at {kit_source} (the labs' setup cells install it from there)")
    return 0
