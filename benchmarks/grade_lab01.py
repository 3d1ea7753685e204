"""Seconds to autograde one lab-01 submission with the kit's nbgrader pipeline (target < 20 s).

A temporary course receives ``--submissions`` copies of the lab-01 solution; ``grade_course``
(the code behind ``transformer-lab labs grade``) records the lab in a fresh gradebook, then
repairs, autogrades (one kernel per notebook, grading profile) and writes feedback for each.
Reported: the one-off gradebook setup, and per submission the median wall time (repair,
kernel start, execution of every cell including hidden tests, feedback HTML).

    python benchmarks/grade_lab01.py              # one submission
    python benchmarks/grade_lab01.py --submissions 3 --out results/grade_lab01.json
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from _common import REPO_ROOT, grading_sandbox, machine, now, write_json

LAB = "01_positional_encoding"
TARGET_S = 20.0


def main() -> int:
    """Grade the solution ``--submissions`` times in a fresh course and print the timings."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--submissions", type=int, default=1, help="copies of the solution to grade")
    p.add_argument("--out", type=Path, default=None, help="write results as JSON here")
    args = p.parse_args()
    if args.submissions < 1:
        raise ValueError(f"--submissions={args.submissions} must be >= 1")

    from transformer_lab.grading.grade import GradingOptions, grade_course

    with tempfile.TemporaryDirectory(prefix="tlab-bench-") as tmp:
        course = Path(tmp)
        for k in range(args.submissions):
            dst = course / "submitted" / f"student{k:03d}" / LAB
            shutil.copytree(REPO_ROOT / "solutions" / LAB, dst)
        start = time.perf_counter()
        options = GradingOptions(sandbox=grading_sandbox())
        report = grade_course(course, REPO_ROOT, [LAB], options=options)
        total = time.perf_counter() - start
    per = [r.seconds for r in report.results]
    bad = [r for r in report.results if r.status != "graded" or r.auto_score != r.auto_max]
    if bad:
        print(f"grading went wrong: {bad}", file=sys.stderr)
        return 1
    median = statistics.median(per)
    setup = total - sum(per)
    print(f"# autograding lab 01 ({now()}; {machine(torch.device('cpu'))})")
    print(f"submissions graded:           {len(per)} (all full marks)")
    print(f"gradebook setup (once):       {setup:.1f} s")
    print(f"per submission (median):      {median:.1f} s  [min {min(per):.1f}, max {max(per):.1f}]")
    verdict = "meets" if median < TARGET_S else "MISSES"
    print(f"autograde one submission:     {median:.1f} s ({verdict} the {TARGET_S:g} s target)")
    write_json(
        args.out,
        {
            "benchmark": "grade_lab01",
            "when": now(),
            "machine": machine(torch.device("cpu")),
            "submissions": len(per),
            "setup_s": round(setup, 2),
            "per_submission_s": per,
            "median_s": round(median, 2),
            "target_s": TARGET_S,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
