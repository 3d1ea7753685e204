"""Render the JSON files written by the benchmarks as markdown tables (for RESULTS.md).

``python benchmarks/report.py benchmarks/results/*.json`` prints one section per file: machine,
date, settings, the table and the verdict against the item's target. Only figures present in
the files are printed, so RESULTS.md can hold nothing that was not measured.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from _common import fmt


def _table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append(
            "| "
            + " | ".join(fmt(r.get(c)) if not isinstance(r.get(c), str) else r[c] for c in cols)
            + " |"
        )
    return "\n".join(lines)


def render(res: dict[str, Any]) -> str:
    """Markdown for one benchmark result."""
    name = res.get("benchmark", "?")
    head = (
        f"### {name}\n\nmachine: {res.get('machine')}; date: {res.get('date')}; "
        f"settings: `{res.get('settings')}`\n"
    )
    rows = res.get("rows", [])
    if name == "attention":
        from bench_attention import SIDE_COLUMNS, side_by_side

        body = _table(side_by_side(rows), SIDE_COLUMNS)
        worst = res.get("mha_fast_worst_ratio")
        if worst is not None:
            verdict = "met" if worst <= 1.10 else "not met"
            median = res.get("mha_fast_median_ratio")
            body += (
                f"\n\nmha_fast: worst ratio {worst:.2f} over all T and modes "
                f"(target <= 1.10 everywhere: {verdict})"
            )
            if median is not None:
                body += f"; median ratio {median:.2f}"
    elif name == "throughput":
        body = _table(
            rows,
            [
                "measure",
                "kit_tok_s",
                "ref_tok_s",
                "ratio",
                "paired_ratio",
                "wall_ratio",
                "cpu_ratio",
            ],
        )
    elif name == "quality":
        body = _table(rows, ["run", "val_loss", "wall_s", "cpu_s", "steps", "tokens_per_s"])
        body += "".join(f"\n\n{v}" for v in [res.get("verdict"), *res.get("variant_verdicts", [])])
    elif name == "generation":
        from bench_generation import COLUMNS

        body = _table(rows, COLUMNS)
    elif name == "labs":
        body = _table(rows, ["lab", "execute_s", "autograde_s", "auto_score", "auto_max", "error"])
    else:
        body = json.dumps(rows, indent=1)
    return f"{head}\n{body}\n"


def main(paths: list[str]) -> None:
    """Print the markdown of every JSON file in ``paths``."""
    for p in paths:
        print(render(json.loads(Path(p).read_text())))


if __name__ == "__main__":
    main(sys.argv[1:])
