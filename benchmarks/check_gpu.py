"""Issue 39's Done-when criteria, checked against one ``gpu.sh --check`` run's results.

On a lent GPU, ``gpu.sh --check`` runs the compiled decode step's benchmark and every lab in the
full profile, then this script reads what they wrote and says, criterion by criterion, whether
it is met:

* every lab no slower than its quiet 2-core CPU time in the full profile, read from the
  ``### CPU, full profile, quiet machine`` tables of ``benchmarks/RESULTS.md`` (the one home of
  those figures);
* lab 08 at least 4x faster than on that CPU;
* the KV cache's speed-up at batch 1 at least 3x in the path lab 08 uses: the figure lab 08's
  own timing cell printed, kept by ``bench_labs.py --outputs`` (on a GPU its compiled cached
  step, ``batch 1, compiled ...: N.Nx faster``, compile time printed beside it; elsewhere the
  eager cache's ``batch 1: ... N.Nx faster``); the kit's compiled decode step at the benchmark's
  size (``bench_generation.py``) is reported beside it;
* the labs step within its time limit (every lab measured, their sum under the limit).

It prints a table (pasteable into RESULTS.md), writes it as JSON with ``--out``, and exits 1
when a criterion is not met (2 when the results cannot be read).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CPU_SECTION = re.compile(r"^### CPU, full profile, quiet machine", re.MULTILINE)
TABLE_ROW = re.compile(r"^\| (\d\d_[a-z0-9_]+) \| ([0-9.]+) \|", re.MULTILINE)
LAB08 = "08_language_models"
# Lab 08's timing cell: the compiled cached step on a GPU, else the eager cache at batch 1.
LAB08_BATCH1 = (
    re.compile(r"^batch 1, compiled .*?: ([0-9.]+)x faster", re.MULTILINE),
    re.compile(r"^batch 1: .*?: ([0-9.]+)x faster", re.MULTILINE),
)


def quiet_cpu_seconds(results_md: Path) -> dict[str, float]:
    """Each lab's full-profile execute time on the quiet 2-core CPU, from RESULTS.md."""
    text = results_md.read_text(encoding="utf-8")
    seconds: dict[str, float] = {}
    for match in CPU_SECTION.finditer(text):
        section = text[match.end() :].split("\n### ", 1)[0]
        for lab, value in TABLE_ROW.findall(section):
            seconds.setdefault(lab, float(value))
    return seconds


def _criterion(name: str, figure: str, target: str, met: bool | None) -> dict[str, Any]:
    verdict = "not measured" if met is None else "met" if met else "not met"
    return {"criterion": name, "figure": figure, "target": target, "verdict": verdict}


def check(
    results: Path, results_md: Path, labs_limit: float, labs_wall: float | None
) -> list[dict[str, Any]]:
    """The criteria's rows for the run in ``results`` (``gpu.sh``'s results folder)."""
    cpu = quiet_cpu_seconds(results_md)
    labs_json = results / "bench_labs.json"
    rows = json.loads(labs_json.read_text())["rows"] if labs_json.is_file() else []
    measured = {r["lab"]: r.get("execute_s") for r in rows}
    out = []
    for lab in sorted(cpu):
        gpu = measured.get(lab)
        figure = "n/a" if gpu is None else f"{gpu:.1f} s"
        out.append(
            _criterion(
                f"{lab} no slower than the quiet 2-core CPU",
                figure,
                f"<= {cpu[lab]:g} s",
                None if gpu is None else gpu <= cpu[lab],
            )
        )
    gpu08 = measured.get(LAB08)
    out.append(
        _criterion(
            "lab 08 at least 4x faster than the CPU",
            "n/a" if gpu08 is None else f"{cpu[LAB08] / gpu08:.2f}x",
            ">= 4x",
            None if gpu08 is None or LAB08 not in cpu else cpu[LAB08] / gpu08 >= 4,
        )
    )
    printed = results / "lab_outputs" / f"{LAB08}.txt"
    text = printed.read_text() if printed.is_file() else ""
    found = next((m for m in (p.search(text) for p in LAB08_BATCH1) if m), None)
    speedup = float(found.group(1)) if found else None
    out.append(
        _criterion(
            "KV cache speed-up at batch 1, lab 08's timing cell",
            "n/a" if speedup is None else f"{speedup:.1f}x",
            ">= 3x",
            None if speedup is None else speedup >= 3,
        )
    )
    generation = results / "bench_generation.json"
    if generation.is_file():
        for row in json.loads(generation.read_text())["rows"]:
            if row["batch"] == 1 and row.get("compiled_speedup") not in (None, "n/a"):
                first = row.get("compiled_first_s", "n/a")
                first = f"{first:.1f} s" if isinstance(first, float) else first
                out.append(
                    _criterion(
                        "KV cache speed-up at batch 1, the kit's compiled decode step",
                        f"{row['compiled_speedup']:.2f}x (first call, compiling: {first})",
                        ">= 3x",
                        row["compiled_speedup"] >= 3,
                    )
                )
    every = bool(cpu) and all(measured.get(lab) is not None for lab in cpu)
    total = sum(v for v in measured.values() if v is not None)
    spent = labs_wall if labs_wall is not None else total
    out.append(
        _criterion(
            "the labs step within its time limit",
            f"{spent:.0f} s, {sum(v is not None for v in measured.values())} labs measured",
            f"every lab, <= {labs_limit:g} s",
            every and spent <= labs_limit,
        )
    )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path, help="gpu.sh's results folder")
    p.add_argument("--results-md", type=Path, default=HERE / "RESULTS.md")
    p.add_argument("--labs-limit", type=float, required=True, help="the labs step's limit, s")
    p.add_argument("--labs-wall", type=float, default=None, help="the labs step's wall time, s")
    p.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    a = p.parse_args(argv)
    try:
        rows = check(a.results, a.results_md, a.labs_limit, a.labs_wall)
    except (OSError, ValueError, KeyError) as e:
        print(f"check_gpu: cannot read the results in {a.results}: {e}", file=sys.stderr)
        return 2
    print("| criterion | figure | target | verdict |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['criterion']} | {r['figure']} | {r['target']} | {r['verdict']} |")
    met = all(r["verdict"] == "met" for r in rows)
    print(f"issue 39 Done-when: {'met' if met else 'not met'}")
    if a.out:
        a.out.write_text(json.dumps({"rows": rows, "met": met}, indent=2) + "\n")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
