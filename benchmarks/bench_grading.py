"""Grading throughput: submissions per hour per core, for each lab, through ``labs grade``.

For every lab the script builds a throw-away course with ``--submissions`` copies of the solution
(each a different student), grades it with the kit's grader (sandboxed where bubblewrap works,
one CPU thread per kernel) once with ``--jobs 1`` and once with ``--jobs N``, and reports:

* ``s_per_submission``: wall seconds per submission with one job;
* ``per_hour_per_core``: submissions per hour per core with N jobs (N cores busy);
* ``term_minutes``: minutes a term of ``--students`` submissions takes on N cores.

Every copy must come back ``graded`` with full marks, or the lab's row says how many did not.
Nothing is written inside the repository.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import REPO_ROOT, now, print_table, write_json
from _common import base_parser as _base_parser


def grade_copies(lab: str, copies: int, jobs: int, workdir: Path) -> tuple[float, int]:
    """Grade ``copies`` submissions of ``lab``'s solution with ``jobs`` jobs.

    Returns:
        ``(wall seconds, how many came back graded with full marks)``.
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
    report = grade_course(course, REPO_ROOT, [lab], jobs=jobs, options=GradingOptions())
    seconds = time.perf_counter() - start
    full = sum(1 for r in report.results if r.status == "graded" and r.auto_score == r.auto_max)
    return seconds, full


def main() -> None:
    parser = _base_parser(__doc__.split("\n")[0])
    parser.add_argument("--labs", nargs="*", default=None, help="labs to measure (default: all)")
    parser.add_argument("--submissions", type=int, default=4, help="copies graded per lab")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel jobs")
    parser.add_argument("--students", type=int, default=300, help="term size for the estimate")
    args = parser.parse_args()
    labs = sorted(
        p.name
        for p in (REPO_ROOT / "solutions").iterdir()
        if p.is_dir() and (not args.labs or any(p.name.startswith(x) for x in args.labs))
    )
    if args.smoke:
        labs, args.submissions = labs[:1], 2
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        for lab in labs:
            one, ok_one = grade_copies(lab, args.submissions, 1, Path(tmp))
            many, ok_many = grade_copies(lab, args.submissions, args.jobs, Path(tmp))
            per_sub = one / args.submissions
            per_hour_core = args.submissions / many * 3600 / args.jobs
            rows.append(
                {
                    "lab": lab,
                    "s_per_submission": round(per_sub, 1),
                    "jobs": args.jobs,
                    "per_hour_per_core": round(per_hour_core),
                    "term_minutes": round(args.students / (per_hour_core * args.jobs) * 60, 1),
                    "full_marks": f"{min(ok_one, ok_many)}/{args.submissions}",
                }
            )
    columns = ["lab", "s_per_submission", "jobs", "per_hour_per_core", "term_minutes", "full_marks"]
    print_table(rows, columns)
    write_json(args.out, {"date": now(), "students": args.students, "rows": rows})


if __name__ == "__main__":
    main()
