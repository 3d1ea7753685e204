"""Run a lab's solution the way a student would, for the course-in-order tests.

``python tests/course_support.py LAB [--all]`` executes, in the current process, the source
notebook's setup cell, answer cells and visible test cells (``--all``: every code cell but
the hidden tests, i.e. the whole notebook a student runs), each in order, and prints one line
per failing cell: ``FAIL <grade id>: <error>`` (``--times``: every cell's seconds too). Run
under ``PYTHONPATH`` of a student package tree, it shows what a student with that package
sees. Exit status 0 when nothing failed.
"""

from __future__ import annotations

import contextlib
import io
import linecache
import re
import sys
import time
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]


def cells(lab: str, everything: bool) -> list[tuple[str, str]]:
    """``(grade id, source)`` of the cells to run, hidden tests and markers removed."""
    nb = nbformat.read(str(REPO / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
    out = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        meta = cell.metadata.get("nbgrader", {})
        gid = meta.get("grade_id", "cell")
        source = re.sub(r"\s*### (BEGIN|END) SOLUTION", "", cell.source)
        if "### BEGIN HIDDEN TESTS" in source:
            continue
        if gid == "setup":
            source = re.sub(r'^KIT_SOURCE = ".*"$', 'KIT_SOURCE = "http://127.0.0.1:9/kit/"',
                            source, flags=re.M)  # fmt: skip
        wanted = everything or gid == "setup" or meta.get("solution") or meta.get("grade")
        if wanted:
            out.append((gid, source))
    return out


def main(argv: list[str]) -> int:
    lab, everything = argv[0], "--all" in argv
    # As IPython does: each cell's source in ``In`` (the saved answers read it) and linecache.
    namespace: dict = {"display": lambda *a, **k: None, "__name__": "__main__", "In": [""]}
    failures = 0
    for number, (gid, source) in enumerate(cells(lab, everything)):
        printed = io.StringIO()
        start = time.perf_counter()
        filename = f"<cell {number}: {gid}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        namespace["In"].append(source)
        try:
            with contextlib.redirect_stdout(printed):
                exec(compile(source, filename, "exec"), namespace)
        except BaseException as exc:  # report every failing cell
            failures += 1
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            print(f"FAIL {gid}: {type(exc).__name__}: {first}")
            if "--trace" in argv:
                import traceback

                traceback.print_exc(limit=-6)
        if "--times" in argv:
            print(f"{time.perf_counter() - start:7.1f} s  {gid}")
        if gid == "setup" or "--verbose" in argv:
            print(printed.getvalue().rstrip())
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
