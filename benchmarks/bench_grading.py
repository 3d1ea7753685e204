"""Grading throughput: submissions per hour per core, for each lab, through ``labs grade``.

For every lab the script builds a throw-away course with ``--submissions`` copies of the solution
(each a different student), grades it with the kit's grader (sandboxed where bubblewrap works,
else unsandboxed and said so; one CPU thread per kernel) once with ``--jobs 1`` and once with
``--jobs N``, and reports:

* ``setup_s``: the lab's fixed cost, paid once per ``labs grade`` run whatever the number of
  submissions (nbgrader's assignment, the lab's gradebooks, the student-package view, merging);
* ``s_per_submission``: median wall seconds of one submission (its own workspace, kernel,
  hidden tests, feedback) with one job;
* ``s_busy``: the same with N jobs at once (N cores busy: what contention costs);
* ``per_hour_per_core``: ``3600 / s_busy``, submissions per hour per core;
* ``term_minutes``: minutes a term of ``--students`` submissions takes on N cores
  (``setup_s`` + students x ``s_busy`` / N).

Every copy must come back ``graded`` with full marks, or the lab's row says how many did not.
Nothing is written inside the repository.

``--against REV`` measures side by side instead: this checkout and a git revision ``REV`` (in a
temporary worktree, e.g. the last commit before a change to the grader) grade the same labs in
turn, ``--rounds`` times each (ABBA order, one job each), each through its own copy of this
script in a fresh process. Machines differ by 2x in speed; a target measured on one machine is
checked on another only this way. ``ratio`` = this checkout's seconds per submission over the
revision's (the medians over the rounds).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import REPO_ROOT, grading_sandbox, now, print_table, write_json
from _common import base_parser as _base_parser


def grade_copies(lab: str, copies: int, jobs: int, workdir: Path) -> dict[str, Any]:
    """Grade ``copies`` submissions of ``lab``'s solution with ``jobs`` jobs.

    Returns:
        ``wall`` (seconds of the whole run), ``per_submission`` (median seconds of one
        submission), ``setup`` (the rest of the wall time with one job, or of the first
        submission's wait with more) and ``full`` (how many came back graded with full marks).
    """
    from transformer_lab.grading.grade import GradingOptions, grade_course

    course = workdir / f"{lab}-{jobs}"
    if course.exists():
        shutil.rmtree(course)
    source = REPO_ROOT / "solutions" / lab / f"{lab}.ipynb"
    for i in range(copies):
        folder = course / "submitted" / f"student{i:03d}" / lab
        folder.mkdir(parents=True)
        shutil.copy(source, folder / f"{lab}.ipynb")
    start = time.perf_counter()
    options = GradingOptions(sandbox=grading_sandbox())
    report = grade_course(course, REPO_ROOT, [lab], jobs=jobs, options=options)
    wall = time.perf_counter() - start
    seconds = sorted(r.seconds or 0.0 for r in report.results)
    full = 0
    for r in report.results:
        if r.status == "graded" and r.auto_score == r.auto_max:
            full += 1
        else:  # say why, so that a broken run is never read as a slow or fast one
            why = r.error or "; ".join([*r.problems, *r.flags]) or f"{r.auto_score}/{r.auto_max}"
            print(f"{lab} {r.student}: {r.status}: {why}", file=sys.stderr)
    return {
        "wall": wall,
        "per_submission": statistics.median(seconds) if seconds else float("nan"),
        "setup": max(wall - sum(seconds) / jobs, 0.0),
        "full": full,
    }


def _graded_by(checkout: Path, lab: str, submissions: int, out: Path) -> dict[str, Any]:
    """One run of ``checkout``'s own copy of this script on ``lab`` (one job), in a fresh
    process that imports that checkout's kit; its row."""
    script = checkout / "benchmarks" / "bench_grading.py"
    command = [sys.executable, str(script), "--labs", lab, "--submissions", str(submissions)]
    env = {**os.environ, "PYTHONPATH": str(checkout), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [*command, "--jobs", "1", "--out", str(out)], env=env, capture_output=True, text=True
    )
    if done.returncode != 0 or not out.is_file():
        raise SystemExit(f"{checkout} could not grade {lab}:\n{done.stderr[-2000:]}")
    return json.loads(out.read_text())["rows"][0]


def compare_with(rev: str, labs: list[str], submissions: int, rounds: int) -> list[dict[str, Any]]:
    """Seconds per submission of this checkout and of revision ``rev``, graded in turn."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-grading-against-") as tmp:
        baseline = Path(tmp) / "baseline"
        subprocess.run(
            ["git", "-C", str(REPO_ROOT), "worktree", "add", "--detach", str(baseline), rev],
            check=True,
            capture_output=True,
        )
        try:
            for lab in labs:
                seconds: dict[str, list[float]] = {"now": [], "then": []}
                full: dict[str, list[str]] = {"now": [], "then": []}
                for turn in range(rounds):
                    order = [("now", REPO_ROOT), ("then", baseline)]
                    for side, checkout in order if turn % 2 == 0 else order[::-1]:
                        row = _graded_by(checkout, lab, submissions, Path(tmp) / f"{side}.json")
                        seconds[side] += [row["s_per_submission"], row["s_busy"]]
                        full[side].append(row["full_marks"])
                now, then = statistics.median(seconds["now"]), statistics.median(seconds["then"])
                rows.append(
                    {
                        "lab": lab,
                        "s_now": round(now, 1),
                        f"s_{rev}": round(then, 1),
                        "ratio": round(now / then, 2),
                        "samples": len(seconds["now"]),
                        "full_marks_now": ", ".join(full["now"]),
                        f"full_marks_{rev}": ", ".join(full["then"]),
                    }
                )
        finally:
            subprocess.run(
                ["git", "-C", str(REPO_ROOT), "worktree", "remove", "--force", str(baseline)],
                capture_output=True,
            )
    return rows


def main() -> None:
    parser = _base_parser(__doc__.split("\n")[0])
    parser.add_argument("--labs", nargs="*", default=None, help="labs to measure (default: all)")
    parser.add_argument("--submissions", type=int, default=4, help="copies graded per lab")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel jobs")
    parser.add_argument("--students", type=int, default=300, help="term size for the estimate")
    parser.add_argument("--against", default=None, help="a git revision to measure side by side")
    parser.add_argument("--rounds", type=int, default=2, help="turns of each side (--against)")
    args = parser.parse_args()
    labs = sorted(
        p.name
        for p in (REPO_ROOT / "solutions").iterdir()
        if p.is_dir() and (not args.labs or any(p.name.startswith(x) for x in args.labs))
    )
    if args.smoke:
        labs, args.submissions = labs[:1], 2
    if args.against:
        rows = compare_with(args.against, labs, args.submissions, args.rounds)
        print_table(rows, list(rows[0]))
        write_json(args.out, {"date": now(), "against": args.against, "rows": rows})
        return
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        for lab in labs:
            one = grade_copies(lab, args.submissions, 1, Path(tmp))
            many = grade_copies(lab, args.submissions, args.jobs, Path(tmp))
            busy = many["per_submission"]
            rows.append(
                {
                    "lab": lab,
                    "setup_s": round(one["setup"], 1),
                    "s_per_submission": round(one["per_submission"], 1),
                    "jobs": args.jobs,
                    "s_busy": round(busy, 1),
                    "per_hour_per_core": round(3600 / busy),
                    "term_minutes": round(
                        (one["setup"] + args.students * busy / args.jobs) / 60, 1
                    ),
                    "full_marks": f"{min(one['full'], many['full'])}/{args.submissions}",
                }
            )
    columns = [
        "lab",
        "setup_s",
        "s_per_submission",
        "jobs",
        "s_busy",
        "per_hour_per_core",
        "term_minutes",
        "full_marks",
    ]
    print_table(rows, columns)
    sandbox = "bubblewrap" if grading_sandbox() == "required" else "none (no bubblewrap here)"
    print(f"sandbox: {sandbox}")
    write_json(
        args.out, {"date": now(), "students": args.students, "sandbox": sandbox, "rows": rows}
    )


if __name__ == "__main__":
    main()
