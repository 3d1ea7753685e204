"""The guard, the log and the static scan, without a kernel (fast; the end-to-end tests are in
test_grading_integrity.py).

Each scenario runs in a fresh Python process: the guard is installed as the kernel does, then
"student" code (compiled under a notebook-cell file name) does something, and the grader's side
reads the signed log back.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat

from transformer_lab.grading.integrity import (
    GuardPlan,
    read_log,
    scan_student_code,
)

REPO = Path(__file__).resolve().parents[1]
LAB = "01_positional_encoding"

_RUNNER = """
import json, sys
from transformer_lab.grading import guard
config = json.loads(sys.argv[1])
guard.install(config)

def cell(source, name):
    code = compile(source, f"/tmp/ipykernel_1/{name}.py", "exec")
    exec(code, NS)

NS = {"__name__": "__main__"}
for source, name in json.loads(sys.argv[2]):
    try:
        cell(source, name)
    except BaseException as exc:
        print("ERROR", name, type(exc).__name__, exc)
"""

SOLUTION = """
import torch
def sinusoidal_encoding(seq_len, d_model, base=10000.0):
    pos = torch.arange(seq_len, dtype=torch.float32)[:, None]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float32)
    a = pos / base ** (two_i / d_model)
    pe = torch.zeros(seq_len, d_model)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(a), torch.cos(a)
    return pe
"""
TEST = (
    "from transformer_lab.checks import lab01\nlab01.check_sinusoidal_encoding(sinusoidal_encoding)"
)


def _run(
    tmp_path: Path,
    cells: list[str],
    *,
    trusted: tuple[str, ...] = (TEST,),
    read_roots: tuple[str, ...] = ("/",),
) -> tuple:
    from transformer_lab.grading.guard import cell_digest

    plan = GuardPlan("ab" * 32, "nonce123", {cell_digest(t): "test_values" for t in trusted})
    log = tmp_path / "guard.log"
    config = plan.guard_config(
        LAB, log=str(log), workspace=str(tmp_path), read_roots=list(read_roots), write_roots=[]
    )
    named = [[c, f"c{i}"] for i, c in enumerate([*cells, plan.finish_source])]
    out = subprocess.run(
        [sys.executable, "-c", _RUNNER, json.dumps(config), json.dumps(named)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    assert "Traceback" not in out.stderr, out.stderr
    reading = read_log(log, plan.key)
    return reading, out.stdout


def test_an_honest_run_is_signed_off_with_nothing_to_review(tmp_path: Path) -> None:
    reading, stdout = _run(tmp_path, [SOLUTION, TEST])
    assert reading.problems == [] and reading.started and reading.finished, stdout
    assert not reading.of("tamper") and not reading.of("violation")


def test_patching_what_the_checks_use_is_recorded(tmp_path: Path) -> None:
    patch = "import torch\ntorch.allclose = lambda *a, **k: True"
    reading, _ = _run(tmp_path, [SOLUTION, patch, TEST])
    assert any("torch.allclose" in " ".join(r["what"]) for r in reading.of("tamper"))


def test_a_replaced_check_is_recorded_for_review(tmp_path: Path) -> None:
    fake = "import transformer_lab.checks.lab01 as m\nm.check_sinusoidal_encoding = lambda fn: None"
    reading, _ = _run(tmp_path, [fake, TEST])
    assert reading.of("tamper")


def test_forged_records_and_a_cut_log_are_found(tmp_path: Path) -> None:
    forge = (
        "import sys\n"
        "sys.audit('transformer_lab.check', 'pass', 'lab01.check_sinusoidal_encoding', 'None')\n"
        "import os\n"
        "for fd in range(3, 50):\n"
        "    try:\n"
        '        os.write(fd, b\'{"seq": 99, "event": "finish"}\\tdeadbeef\\n\')\n'
        "    except OSError:\n"
        "        pass"
    )
    reading, _ = _run(tmp_path, [forge])
    assert reading.of("forged")
    assert any("forged" in p for p in reading.problems)


def test_student_code_cannot_read_outside_or_use_sqlite(tmp_path: Path) -> None:
    outside = tmp_path.parent / "secret.txt"
    outside.write_text("the answers")
    reach = (
        f"try:\n    open({str(outside)!r}).read()\n"
        "except PermissionError as e:\n    print('refused')\n"
        "import sqlite3\n"
        "try:\n    sqlite3.connect(':memory:')\nexcept PermissionError:\n    print('no sqlite')"
    )
    roots = (
        sys.prefix,
        sys.base_prefix,
        "/usr",
        "/lib",
        "/etc",
        "/proc",
        "/sys",
        "/dev",
        str(REPO),
    )
    reading, stdout = _run(tmp_path, [reach], read_roots=roots)
    assert "refused" in stdout and "no sqlite" in stdout
    assert {r["what"] for r in reading.of("violation")} >= {"open", "sqlite3.connect"}


def test_static_scan_names_the_cheat_constructs() -> None:
    nb = nbformat.read(str(REPO / "labs" / LAB / f"{LAB}.ipynb"), as_version=4)
    nb.cells.insert(
        2,
        nbformat.v4.new_code_cell(
            "import sys, builtins\n"
            "sys.modules['x'] = None\n"
            "lab01.check_sinusoidal_encoding = print\n"
            "torch.allclose = lambda *a: True\n"
            "get_ipython().set_custom_exc((Exception,), print)\n"
            "import os\nos._exit(0)\n"
        ),
    )
    flags = "\n".join(scan_student_code(nb))
    for words in (
        "changes sys.modules",
        "imports builtins",
        "changes lab01.check_sinusoidal_encoding",
        "changes torch.allclose",
        "set_custom_exc",
        "os._exit",
    ):
        assert words in flags, words
    # The honest release and solution raise nothing.
    assert scan_student_code(nbformat.read(str(REPO / "labs" / LAB / f"{LAB}.ipynb"), 4)) == []
    solution = nbformat.read(str(REPO / "solutions" / LAB / f"{LAB}.ipynb"), 4)
    assert scan_student_code(solution) == []
