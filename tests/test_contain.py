"""Containment and the kernel's command line, without a kernel (fast; Linux).

The real bombs go through ``labs grade`` in tests/test_grading_containment.py; here a detached
daemon is ended by :class:`Containment` alone, and the sandbox's command line is read for its
limits.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import NEEDS

from transformer_lab.grading.contain import Containment, descendants
from transformer_lab.grading.sandbox import KernelSandbox, find_bwrap

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux process control")

DAEMON = (
    "import os, sys\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        os.execvp('sleep', ['sleep', '613.4567'])\n"
    "    os._exit(0)\n"
)


def _sleepers() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and "613.4567" in (entry / "cmdline").read_text():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_a_detached_daemon_is_ended_with_its_submission() -> None:
    with Containment(max_tasks=64, memory_bytes=2**30) as contained:
        subprocess.run([sys.executable, "-c", DAEMON], check=True, timeout=60)
        for _ in range(100):  # the grandchild execs sleep a moment later
            if _sleepers():
                break
            time.sleep(0.05)
        daemon = _sleepers()
        assert daemon, "the daemon did not start"
        if contained.subreaper:  # re-parented to us, not to init
            assert set(daemon) <= set(descendants())
        else:  # without a subreaper only a cgroup can find it
            assert contained.groups
    assert _sleepers() == []
    assert contained.groups == []  # the cgroups are removed again


def test_the_sandbox_bounds_its_ram_file_systems_and_counts_them(tmp_path: Path) -> None:
    box = KernelSandbox(
        workspace=tmp_path / "home",
        run_dir=tmp_path / "run",
        memory_bytes=4 * 2**30,
        max_tasks=100,
        tmp_bytes=2**30,
        shm_bytes=2**28,
        launcher_args=["--cgroup", "/sys/fs/cgroup/pids/x/cgroup.procs"],
        use_bwrap=False,
    )
    plain = box.command(["kernel"])
    assert plain[plain.index("--chdir") + 1] == str(tmp_path / "home")
    assert plain[plain.index("--nproc") + 1] == "100"
    assert plain[plain.index("--cgroup") + 1].endswith("cgroup.procs")
    assert plain[plain.index("--memory") + 1] == str(4 * 2**30)  # no RAM file system here
    box.use_bwrap = True
    assert box.address_space() == 4 * 2**30 - 2**30 - 2**28
    if find_bwrap() is None:
        pytest.skip(NEEDS["bubblewrap"])
    line = " ".join(box.command(["kernel"]))
    assert f"--size {2**30} --tmpfs /tmp" in line
    assert f"--size {2**28} --tmpfs /dev/shm --remount-ro /dev" in line
    assert f"--memory {box.address_space()}" in line
