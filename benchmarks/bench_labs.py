"""Item 4: how long the labs take, per solution notebook.

For every ``solutions/NN_name/`` that exists when it runs, the script measures:

* ``execute_s``: executing the solution notebook top to bottom in a fresh kernel (nbclient),
  under the profile chosen with ``--profile`` (``grading``: the instructor's CPU budget, the
  target being about a minute of training per lab; ``full``: the student's GPU run). Where
  Jupyter is not installed (a lent GPU machine with only its own torch stack), ``--runner
  script`` runs the notebook's code cells in order in a fresh Python process instead: the same
  code and the same namespace rules, minus the kernel's start-up (about a second);
* ``autograde_s``: autograding one submission of that lab (the solution itself, submitted as a
  student would) through the kit's nbgrader pipeline in ``transformer_lab.grading``, in a
  throw-away course directory.

Nothing is written inside the repository: executed notebooks and the course live in a
temporary directory. Reference: nbgrader's autograding workflow (``nbgrader autograde``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import REPO_ROOT, grading_sandbox, machine, now, print_table, write_json
from _common import base_parser as _base_parser


def find_labs(solutions: Path, only: list[str] | None = None) -> list[Path]:
    """Solution notebooks ``solutions/<lab>/<lab>.ipynb``, sorted by lab number."""
    labs = []
    for lab_dir in sorted(p for p in solutions.glob("*/") if p.is_dir()):
        if only and lab_dir.name not in only:
            continue
        nb = lab_dir / f"{lab_dir.name}.ipynb"
        if nb.exists():
            labs.append(nb)
        else:
            labs.extend(sorted(lab_dir.glob("*.ipynb"))[:1])
    return labs


def execute_notebook(nb_path: Path, workdir: Path, profile: str, timeout: int) -> float:
    """Execute a copy of ``nb_path`` in ``workdir`` under ``profile``; return the seconds taken."""
    import nbformat
    from nbclient import NotebookClient

    lab_copy = workdir / nb_path.parent.name
    shutil.copytree(nb_path.parent, lab_copy, dirs_exist_ok=True)
    nb = nbformat.read(lab_copy / nb_path.name, as_version=4)
    old = os.environ.get("TRANSFORMER_LAB_PROFILE")
    os.environ["TRANSFORMER_LAB_PROFILE"] = profile
    try:
        client = NotebookClient(
            nb,
            timeout=timeout,
            kernel_name="python3",
            resources={"metadata": {"path": str(lab_copy)}},
        )
        t0 = time.perf_counter()
        client.execute()
        return time.perf_counter() - t0
    finally:
        if old is None:
            os.environ.pop("TRANSFORMER_LAB_PROFILE", None)
        else:
            os.environ["TRANSFORMER_LAB_PROFILE"] = old


# Runs a notebook's code cells in one namespace, as a kernel would; `display` is IPython's.
_SCRIPT_RUNNER = """
import json, sys
cells = json.load(open(sys.argv[1], encoding="utf-8"))["cells"]
namespace = {"__name__": "__main__", "display": lambda *objects, **kwargs: None}
for number, cell in enumerate(cells):
    if cell["cell_type"] == "code":
        source = "".join(cell["source"])
        exec(compile(source, f"<cell {number}>", "exec"), namespace)
"""


def execute_as_script(
    nb_path: Path, workdir: Path, profile: str, timeout: int, output: Path | None = None
) -> float:
    """Run a copy of ``nb_path``'s code cells in a fresh Python process; return the seconds.

    ``output``: a file to keep what the cells printed in (e.g. lab 08's cache speed-up, which
    ``check_gpu.py`` reads).
    """
    import subprocess
    import sys

    lab_copy = workdir / nb_path.parent.name
    shutil.copytree(nb_path.parent, lab_copy, dirs_exist_ok=True)
    env = {**os.environ, "TRANSFORMER_LAB_PROFILE": profile, "MPLBACKEND": "Agg"}
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT_RUNNER, nb_path.name],
        cwd=lab_copy,
        env=env,
        timeout=timeout,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - t0
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(done.stdout + done.stderr, encoding="utf-8")
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "")
    return seconds


def warm_up() -> float:
    """Load torch, Lightning and the kit once, untimed, in a process of its own; the seconds.

    The first process of a run otherwise pays for reading PyTorch's libraries (several GB with
    CUDA's) from a cold disk, which the laps after it find in the page cache: on the H200 of
    2026-12-04 lab 01 took 15.8 s, most of it that. The CPU figures it is compared with were
    measured on a machine that had loaded them before.
    """
    import subprocess
    import sys

    code = (
        "import torch, lightning, transformer_lab.lab\n"
        "if torch.cuda.is_available(): torch.zeros(1, device='cuda')"
    )
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=False, capture_output=True)
    return time.perf_counter() - t0


def jupyter_available() -> bool:
    """Whether nbclient and a Python kernel are installed (the ``kernel`` runner's needs)."""
    import importlib.util

    return all(importlib.util.find_spec(m) for m in ("nbclient", "nbformat", "ipykernel"))


def autograde_one(nb_path: Path, workdir: Path, profile: str) -> dict[str, Any]:
    """Autograde the solution as one student's submission through ``transformer_lab.grading``.

    A fresh course folder gets ``submitted/solution/<lab>/<lab>.ipynb``; the timed call is the
    kit's whole ``grade_course`` (record the lab in a new gradebook, repair metadata, execute
    and score, write feedback and the CSV), i.e. what ``transformer-lab labs grade`` costs for
    one submission.

    Returns:
        ``{"autograde_s", "auto_score", "auto_max", "status"}``.
    """
    from transformer_lab.grading.grade import GradingOptions, grade_course

    lab = nb_path.parent.name
    course = workdir / lab
    dst = course / "submitted" / "solution" / lab
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy2(nb_path, dst / nb_path.name)
    t0 = time.perf_counter()
    options = GradingOptions(sandbox=grading_sandbox())
    report = grade_course(course, REPO_ROOT, labs=[lab], profile=profile, options=options)
    seconds = time.perf_counter() - t0
    res = report.find("solution", lab)
    if res.status != "graded":
        raise RuntimeError(f"{lab}: {res.status}: {res.error[:300]}")
    return {
        "autograde_s": seconds,
        "auto_score": res.auto_score,
        "auto_max": res.auto_max,
        "status": res.status,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the labs benchmark and return its results."""
    p = _base_parser(__doc__.splitlines()[0])
    p.add_argument("--profile", choices=["grading", "full"], default="grading")
    p.add_argument("--labs", nargs="*", default=None, help="lab folder names (default: all)")
    p.add_argument("--solutions", type=Path, default=REPO_ROOT / "solutions")
    p.add_argument("--no-autograde", action="store_true")
    p.add_argument("--timeout", type=int, default=1200, help="per-cell timeout, seconds")
    p.add_argument(
        "--outputs",
        type=Path,
        default=None,
        help="keep each lab's printed output in DIR/<lab>.txt (script runner)",
    )
    p.add_argument(
        "--warm-up",
        action="store_true",
        help="load torch, Lightning and the kit once, untimed, before the first lab",
    )
    p.add_argument(
        "--runner",
        choices=["auto", "kernel", "script"],
        default="auto",
        help="execute in a Jupyter kernel (nbclient) or as a script; auto: kernel if installed",
    )
    a = p.parse_args(argv)
    runner = a.runner
    if runner == "auto":
        runner = "kernel" if jupyter_available() else "script"
    if runner == "kernel":
        execute = execute_notebook
    else:

        def execute(nb: Path, workdir: Path, profile: str, timeout: int) -> float:
            kept = a.outputs / f"{nb.parent.name}.txt" if a.outputs else None
            return execute_as_script(nb, workdir, profile, timeout, kept)

    if runner == "script" and not a.no_autograde:
        print("no Jupyter here (script runner): autograding skipped")
        a.no_autograde = True
    labs = find_labs(a.solutions, a.labs)
    if a.smoke:
        labs = labs[:1]
    if not labs:
        print(f"no solution notebooks under {a.solutions}")
    rows: list[dict[str, Any]] = []
    import torch

    result = {
        "benchmark": "labs",
        "machine": machine(torch.device("cuda" if torch.cuda.is_available() else "cpu")),
        "date": now(),
        "settings": {"profile": a.profile, "smoke": a.smoke, "runner": runner},
        "rows": rows,
    }
    if a.warm_up:
        result["settings"]["warm_up_s"] = round(warm_up(), 1)
        print(f"warm-up (untimed): {result['settings']['warm_up_s']} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_labs_") as tmp:
        for nb in labs:
            row: dict[str, Any] = {"lab": nb.parent.name}
            try:
                row["execute_s"] = execute(nb, Path(tmp) / "exec", a.profile, a.timeout)
            except Exception as e:  # report and go on: one broken lab must not hide the others
                row["execute_s"] = None
                row["error"] = f"execute: {type(e).__name__}: {str(e)[:200]}"
            if not a.no_autograde:
                try:
                    row.update(autograde_one(nb, Path(tmp) / "course", a.profile))
                except Exception as e:
                    row["autograde_s"] = None
                    row.setdefault("error", f"autograde: {type(e).__name__}: {str(e)[:200]}")
            rows.append(row)
            print(
                f"{row['lab']}: execute {row.get('execute_s')}, autograde {row.get('autograde_s')}"
                + (f"  [{row['error']}]" if "error" in row else ""),
                flush=True,
            )
            write_json(a.out, result)  # a time limit cutting a later lab keeps this one
    print_table(rows, ["lab", "execute_s", "autograde_s", "auto_score", "auto_max"])
    write_json(a.out, result)
    return result


if __name__ == "__main__":
    main()
