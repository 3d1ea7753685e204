"""Seconds to re-grade a course: unchanged (nothing graded again), then one submission changed.

A temporary course receives ``--submissions`` copies of the lab-01 solution and is graded with
``grade_course`` (the code behind ``transformer-lab labs grade``); then it is graded again as it
is (every submission skipped: same submission, lab source, kit and options), then once more
after one submission changed (only it is graded). Issue 37's figure before this: 91 s to
re-grade 5 unchanged submissions.

    python benchmarks/bench_regrade.py --submissions 5 --out results/regrade.json
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
from _common import REPO_ROOT, machine, now, write_json

LAB = "01_positional_encoding"


def main() -> int:
    """Grade, re-grade unchanged, re-grade with one change; print the three wall times."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--submissions", type=int, default=5, help="copies of the solution")
    p.add_argument("--out", type=Path, default=None, help="write results as JSON here")
    args = p.parse_args()
    if args.submissions < 2:
        raise ValueError(f"--submissions={args.submissions} must be >= 2")

    from transformer_lab.grading.grade import grade_course

    times: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="tlab-regrade-") as tmp:
        course = Path(tmp)
        for k in range(args.submissions):
            shutil.copytree(REPO_ROOT / "solutions" / LAB, course / "submitted" / f"s{k:03d}" / LAB)
        runs = {}
        for name in ("first", "unchanged", "one changed"):
            if name == "one changed":
                notebook = course / "submitted" / "s000" / LAB / f"{LAB}.ipynb"
                notebook.write_text(notebook.read_text().replace("\n", "\n ", 1))
            start = time.perf_counter()
            runs[name] = grade_course(course, REPO_ROOT, [LAB])
            times[name] = time.perf_counter() - start
    graded = {name: len(report.results) for name, report in runs.items()}
    if graded != {"first": args.submissions, "unchanged": 0, "one changed": 1}:
        print(f"unexpected runs: graded {graded}", file=sys.stderr)
        return 1
    print(f"# re-grading lab 01 ({now()}; {machine(torch.device('cpu'))})")
    for name, seconds in times.items():
        print(f"{name:<12} graded {graded[name]} of {args.submissions}: {seconds:6.1f} s")
    write_json(
        args.out,
        {
            "benchmark": "regrade",
            "when": now(),
            "machine": machine(torch.device("cpu")),
            "submissions": args.submissions,
            "seconds": {k: round(v, 2) for k, v in times.items()},
            "graded": graded,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
