"""One submission's processes kept together and all ended with it, sandboxed or not.

A kernel can fork, start a daemon that calls ``setsid`` (leaving the kernel's process group),
or fork until the machine is full. :class:`Containment` bounds and ends all of it:

* **a cgroup where there is one** (cgroup v2, or v1's ``pids`` and ``memory`` controllers, when
  this process may create groups below its own): ``pids.max`` bounds the submission's tasks
  (processes and threads), the memory limit bounds all of them together *including what they
  write to RAM file systems* (tmpfs pages are charged to the cgroup), and at the end every
  task in it is killed. The kernel's launcher (:mod:`~transformer_lab.grading.limits`) joins
  the groups before it starts anything (``--cgroup``), so nothing the kernel starts is outside;
  inside bubblewrap ``/sys`` is read-only, so nothing can leave either;
* **a subreaper always**: the grader's process marks itself ``PR_SET_CHILD_SUBREAPER``
  (prctl(2)), so a daemon that detaches (double fork, ``setsid``) is re-parented to the grader
  instead of init; when the submission ends, every process below the grader that was not there
  when it began is killed (``SIGKILL``, repeated until none is left, then reaped).

In the bubblewrap sandbox the kernel also has its own PID namespace, which the Linux kernel
ends with its first process; the two mechanisms above are what holds without it.

Reference: prctl(2) ``PR_SET_CHILD_SUBREAPER``; cgroups(7); Documentation/admin-guide/cgroup-v2.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
import uuid
from pathlib import Path
from types import TracebackType

__all__ = ["Containment", "become_subreaper", "descendants"]

PR_SET_CHILD_SUBREAPER = 36
CGROUP_ROOT = Path("/sys/fs/cgroup")


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux); False where it can't."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _parents() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state) for every process visible in ``/proc``."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        table[int(entry.name)] = (int(fields[1]), fields[0])
    return table


def descendants(pid: int | None = None) -> dict[int, str]:
    """Every process below ``pid`` (default: this one) and its state (``Z``: a zombie)."""
    root = os.getpid() if pid is None else pid
    children: dict[int, list[int]] = {}
    table = _parents()
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found, todo = {}, list(children.get(root, []))
    while todo:
        child = todo.pop()
        if child not in found:
            found[child] = table[child][1]
            todo += children.get(child, [])
    return found


def _own_cgroups() -> list[tuple[Path, str]]:
    """(mount point, path of this process's group) for v2 and v1's pids and memory."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    groups = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "" and (CGROUP_ROOT / "cgroup.controllers").is_file():
            groups.append((CGROUP_ROOT, path))
        for name in ("pids", "memory"):
            if name in controllers.split(",") and (CGROUP_ROOT / name).is_dir():
                groups.append((CGROUP_ROOT / name, path))
    return groups


class Containment:
    """The processes of one submission: bounded while it runs, all killed when it ends.

    Use as a context manager around the submission's run; pass :attr:`launcher_args` to the
    kernel's launcher so that it joins the cgroups.

    Args:
        max_tasks: processes and threads the submission may have at once (cgroup ``pids.max``).
        memory_bytes: memory of all its processes together, tmpfs included (cgroup limit).
    """

    def __init__(self, max_tasks: int, memory_bytes: int) -> None:
        self.max_tasks, self.memory_bytes = max_tasks, memory_bytes
        self.groups: list[Path] = []
        self.subreaper = False
        self._before: set[int] = set()
        self.started = False

    @property
    def launcher_args(self) -> list[str]:
        """``--cgroup FILE`` for each group the kernel's launcher must join."""
        return [arg for group in self.groups for arg in ("--cgroup", str(group / "cgroup.procs"))]

    @property
    def kind(self) -> str:
        """How it is contained, for the report: ``cgroup+subreaper``, ``subreaper`` or ``none``."""
        return "+".join(["cgroup"] * bool(self.groups) + ["subreaper"] * self.subreaper) or "none"

    def __enter__(self) -> Containment:
        return self.start()

    def start(self) -> Containment:
        """Become the subreaper, note what runs already, and create the cgroups."""
        self.started = True
        self.subreaper = become_subreaper()
        self._before = set(descendants())
        name = f"tlab-{uuid.uuid4().hex[:12]}"
        for mount, path in _own_cgroups():
            group = mount / path.lstrip("/") / name
            try:
                group.mkdir()
                self._limit(group)
            except OSError:
                with contextlib.suppress(OSError):
                    group.rmdir()
                continue
            self.groups.append(group)
        return self

    def _limit(self, group: Path) -> None:
        settings = {
            "pids.max": self.max_tasks,
            "memory.max": self.memory_bytes,  # v2
            "memory.swap.max": 0,
            "memory.limit_in_bytes": self.memory_bytes,  # v1
        }
        wrote = False
        for name, value in settings.items():
            if (group / name).is_file() and value:
                with contextlib.suppress(OSError):
                    (group / name).write_text(str(value))
                    wrote = True
        if not wrote:
            raise OSError(f"{group}: no limit could be set")

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.end()

    def end(self) -> int:
        """Kill every process of the submission; return how many were still alive."""
        if not self.started:
            return 0
        self.started = False
        killed: set[int] = set()
        for _ in range(200):
            alive = {pid for group in self.groups for pid in _members(group)}
            alive |= {p for p, state in descendants().items() if state != "Z"} - self._before
            if not alive:
                break
            for pid in alive - {os.getpid()}:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            killed |= alive
            self._reap(killed)
            time.sleep(0.01)
        self._reap(killed)
        for group in self.groups:
            for _ in range(50):
                try:
                    group.rmdir()
                    break
                except OSError:  # its last tasks are still exiting
                    time.sleep(0.02)
        self.groups = []
        return len(killed)

    @staticmethod
    def _reap(pids: set[int]) -> None:
        """Collect the killed processes that were re-parented to this one (no zombies left)."""
        for pid in pids:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)


def _members(group: Path) -> set[int]:
    try:
        return {int(p) for p in (group / "cgroup.procs").read_text().split()}
    except OSError:
        return set()
