"""Grading on a Dask cluster: submissions per hour with 1 and 2 workers, and the coordinator's cost.

A throw-away course receives ``--submissions`` copies of lab 01's solution (each a different
student) and is graded through ``labs grade --cluster local:N`` (a ``LocalCluster`` of N
one-thread worker processes on this machine) for each N in ``--workers``. Reported per N:

* ``wall_s``: the whole run (the lab's preparation, the cluster's start, every submission);
* ``first_s``: until the first submission was accepted (the fixed cost of a run);
* ``per_hour``: steady submissions per hour, between the first accepted and the last;
* ``coordinator_ms``: the coordinating process's own time per submission, measured around
  what it does with each (the worker's reply made into files, then the gradebook write, the
  gradebook's fingerprint checks, the feedback copied into place, the journal); what bounds a
  cluster of 1,000 workers, since one coordinator accepts every submission in turn;
* ``gradebook_kb``: what each submission adds to the gradebook, and ``hash_mb_s``: how fast this
  machine hashes it (the coordinator hashes the whole gradebook twice per submission to notice
  a writer other than itself, so its cost grows with the term: see ``term_coordinator_s``, the
  estimate for the last submission of a term of ``--term`` submissions).

Every copy must come back ``graded`` with full marks. Nothing is written in the repository.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import REPO_ROOT, grading_sandbox, now, print_table, write_json
from _common import base_parser as _base_parser

LAB = "01_positional_encoding"


class _Stopwatch:
    """Seconds the coordinator spends on accepted submissions (one thread does it all)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, module: Any, name: str) -> None:
        """Time every call of ``module.name``."""
        inner = getattr(module, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        setattr(module, name, timed)

    def wrap_consumer(self, module: Any, name: str) -> None:
        """Time what the caller of the generator ``module.name`` does with each item: the
        coordinator's acceptance of each result (gradebook, files, checks, journal)."""
        inner = getattr(module, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            for item in inner(*args, **kwargs):
                start = time.perf_counter()
                yield item
                self.seconds += time.perf_counter() - start

        setattr(module, name, timed)


def grade_on(workers: int, copies: int, workdir: Path) -> dict[str, Any]:
    """Grade ``copies`` of the solution on ``local:workers``; timings and the coordinator's cost."""
    import transformer_lab.grading.cluster as cluster
    import transformer_lab.grading.grade as grade

    course = workdir / f"course-{workers}"
    source = REPO_ROOT / "solutions" / LAB / f"{LAB}.ipynb"
    for i in range(copies):
        folder = course / "submitted" / f"student{i:03d}" / LAB
        folder.mkdir(parents=True)
        shutil.copy(source, folder / f"{LAB}.ipynb")
    watch = _Stopwatch()
    saved = {name: getattr(cluster, name) for name in ("_received", "grade_on_cluster")}
    watch.wrap(cluster, "_received")  # the worker's reply made into files
    watch.wrap_consumer(cluster, "grade_on_cluster")  # the rest of accepting it
    accepted: list[float] = []
    start = time.perf_counter()
    try:
        report = grade.grade_course(
            course,
            REPO_ROOT,
            [LAB],
            options=grade.GradingOptions(sandbox=grading_sandbox()),
            cluster=f"local:{workers}",
            progress=lambda *_: accepted.append(time.perf_counter() - start),
        )
    finally:
        for name, inner in saved.items():
            setattr(cluster, name, inner)
    wall = time.perf_counter() - start
    full = sum(r.status == "graded" and r.auto_score == r.auto_max for r in report.results)
    for r in report.results:
        if not (r.status == "graded" and r.auto_score == r.auto_max):
            print(f"{r.student}: {r.status}: {r.error or r.problems or r.flags}", file=sys.stderr)
    first = accepted[0] if accepted else float("nan")
    span = accepted[-1] - accepted[0] if len(accepted) > 1 else float("nan")
    steady = (len(accepted) - 1) / span * 3600 if span > 0 else float("nan")
    empty = (course / ".grading" / "templates" / LAB / "gradebook.db").stat().st_size
    added = (course / "gradebook.db").stat().st_size - empty
    return {
        "workers": workers,
        "submissions": copies,
        "full_marks": f"{full}/{copies}",
        "wall_s": round(wall, 1),
        "first_s": round(first, 1),
        "per_hour": round(steady) if steady == steady else None,
        "coordinator_ms": round(1000 * watch.seconds / copies, 1),
        "gradebook_kb": round(added / 1024 / copies, 1),
    }


def hash_rate() -> float:
    """MB/s of sha256 on this machine (what the coordinator's gradebook fingerprint costs)."""
    data = os.urandom(64 * 2**20)
    start = time.perf_counter()
    hashlib.sha256(data).hexdigest()
    return 64 / (time.perf_counter() - start)


def main() -> None:
    parser = _base_parser(__doc__.split("\n")[0])
    parser.add_argument("--submissions", type=int, default=6, help="copies graded per run")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="cluster sizes")
    parser.add_argument("--term", type=int, default=160_000, help="term size for the estimate")
    args = parser.parse_args()
    if args.smoke:
        args.submissions, args.workers = 2, [2]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        for workers in args.workers:
            rows.append(grade_on(workers, args.submissions, Path(tmp)))
    rate = hash_rate()
    for row in rows:
        row["hash_mb_s"] = round(rate)
        # Two full hashes of a gradebook of `term` submissions, for the term's last one.
        row["term_coordinator_s"] = round(2 * row["gradebook_kb"] * args.term / 1024 / rate, 1)
    columns = list(rows[0])
    print_table(rows, columns)
    sandbox = "bubblewrap" if grading_sandbox() == "required" else "none (no bubblewrap here)"
    print(f"sandbox: {sandbox}; {os.cpu_count()} cores")
    write_json(
        args.out,
        {"date": now(), "lab": LAB, "sandbox": sandbox, "term": args.term, "rows": rows},
    )


if __name__ == "__main__":
    main()
