"""The container path: ``labs grade`` run inside a podman container, bubblewrap inside it.

``container/Containerfile`` is the image for machines where bubblewrap does not work (macOS and
Windows through podman machine or Docker Desktop). Its base image cannot be fetched where these
tests run (only package registries are reachable), so the test builds the same container from
this machine's own files instead: an empty root with the system, the Python environment and the
repository mounted read-only, and only the course writable, run with the options
``docs/grading.md`` gives (no network, ``/proc`` unmasked). The grader inside must find
a working bubblewrap and grade lab 01's solution 12/12 and the untouched release 0/12.

podman 4.3 (Debian bookworm) runs here only with ``runc`` (``crun`` refuses a host with both
cgroup versions mounted) and with a ``nofile`` limit this machine allows (podman's defaults,
1048576 files and 32768 processes, are above its hard limits; ``--ulimit`` is ignored).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import NEEDS

REPO = Path(__file__).resolve().parents[1]
LAB = "01_positional_encoding"

pytestmark = pytest.mark.slow


def _podman() -> list[str]:
    podman, runc = shutil.which("podman"), shutil.which("runc")
    if podman is None or runc is None:
        pytest.skip(NEEDS["podman"])
    return [podman, "--runtime", runc]


def _mounts(course: Path) -> list[str]:
    """The container's file system: this machine's system, Python and repository read-only."""
    read_only = {"/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc", str(REPO), sys.base_prefix}
    read_only.add(sysconfig.get_paths()["stdlib"])
    args = []
    for path in sorted(p for p in read_only if os.path.exists(p)):
        args += ["-v", f"{os.path.realpath(path)}:{path}:ro"]
    return [*args, "-v", f"{course}:{course}:rw", "--tmpfs", "/tmp:size=2g"]


def test_the_grader_in_a_container_gives_the_solution_all_and_the_release_nothing(
    tmp_path: Path,
) -> None:
    podman = _podman()
    course = tmp_path / "course"
    for student, folder in (("sol", "solutions"), ("rel", "labs")):
        dest = course / "submitted" / student / LAB
        dest.mkdir(parents=True)
        shutil.copyfile(REPO / folder / LAB / f"{LAB}.ipynb", dest / f"{LAB}.ipynb")
    # podman's defaults are above what this machine allows: lower ones (as the grader's own).
    limits = ["nofile=1024:1024", "nproc=4096:4096"]
    conf = tmp_path / "containers.conf"
    conf.write_text(f"[containers]\ndefault_ulimits = {json.dumps(limits)}\n")
    (tmp_path / "rootfs").mkdir()
    python = os.path.normpath(os.path.abspath(sys.executable))
    env = ["-e", "HOME=/tmp", "-e", "OMP_NUM_THREADS=1", "-e", "PYTHONDONTWRITEBYTECODE=1"]
    command = [
        *podman,
        "run",
        "--rm",
        "--network",
        "none",
        "--read-only",
        "--security-opt",
        "unmask=/proc/*",  # bubblewrap mounts a new /proc: the kernel refuses under masks
        *_mounts(course),
        *env,
        "-w",
        str(course),
        "--rootfs",
        str(tmp_path / "rootfs"),
        python,
        "-m",
        "transformer_lab.cli",
        "labs",
        "--repo",
        str(REPO),
        "grade",
        "--course",
        str(course),
        "--timeout",
        "60",
    ]
    done = subprocess.run(
        command,
        env={**os.environ, "CONTAINERS_CONF": str(conf)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(course / "grades.csv", newline="") as handle:
        rows = {row["student_id"]: row for row in csv.DictReader(handle)}
    assert float(rows["sol"]["raw_score"]) == 12.0 and rows["sol"]["status"] == "graded"
    assert float(rows["rel"]["raw_score"]) == 0.0 and rows["rel"]["status"] == "graded"
    report = json.loads((course / "grading_report.json").read_text())
    assert {r["sandbox"] for r in report["runs"][-1]["results"]} == {"bubblewrap"}
