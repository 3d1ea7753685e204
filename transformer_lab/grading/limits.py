"""Start a command with resource limits: ``python -m transformer_lab.grading.limits [opts] -- cmd``.

The grader starts each submission's kernel through this module, which sets the limits with
``resource.setrlimit`` and then replaces itself with the command (``os.execvp``), so the limits
hold for the sandbox and the kernel inside it:

* ``--memory BYTES``: address space (a runaway allocation fails with ``MemoryError``);
* ``--cpu SECONDS``: CPU time of the kernel (it is killed after that, whatever it does);
* ``--output FILE``: the command's standard output and error go there (the kernel's own
  messages, a crash's last words), not to the grader's terminal;
* ``--nproc N``: ``RLIMIT_NPROC``, N more tasks than this user has now (Linux counts the
  limit per user, not per process tree; it does not bind root, for whom the cgroup's
  ``pids.max`` of :mod:`~transformer_lab.grading.contain` is the bound);
* ``--cgroup FILE`` (repeatable): join a cgroup (write this process's id into its
  ``cgroup.procs``) before anything starts, so every descendant is in it;
* ``--chdir DIR``: the working directory (the submission's workspace, never the course);
* always: files of at most 1 GiB, 1024 open files, no core dumps.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys

__all__ = ["main"]

MAX_FILE_BYTES = 1 << 30


def main(argv: list[str] | None = None) -> None:
    """Parse the limits, set them, and exec the command after ``--``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args:
        raise SystemExit("usage: python -m transformer_lab.grading.limits [opts] -- command ...")
    cut = args.index("--")
    parser = argparse.ArgumentParser(prog="transformer_lab.grading.limits")
    parser.add_argument("--memory", type=int, default=0, help="address-space limit in bytes")
    parser.add_argument("--cpu", type=int, default=0, help="CPU-time limit in seconds")
    parser.add_argument("--output", default="", help="file that receives stdout and stderr")
    parser.add_argument("--nproc", type=int, default=0, help="tasks beyond this user's own")
    parser.add_argument("--cgroup", action="append", default=[], help="a cgroup.procs to join")
    parser.add_argument("--chdir", default="", help="working directory of the command")
    ns = parser.parse_args(args[:cut])
    command = args[cut + 1 :]
    if not command:
        raise SystemExit("transformer_lab.grading.limits: no command after --")
    for procs in ns.cgroup:
        with open(procs, "w") as handle:
            handle.write(str(os.getpid()))
    if ns.nproc:
        tasks = ns.nproc + _tasks_of(os.getuid())
        resource.setrlimit(resource.RLIMIT_NPROC, (tasks, tasks))
    if ns.chdir:
        os.chdir(ns.chdir)
    if ns.memory:
        resource.setrlimit(resource.RLIMIT_AS, (ns.memory, ns.memory))
    if ns.cpu:
        resource.setrlimit(resource.RLIMIT_CPU, (ns.cpu, ns.cpu + 5))
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE_BYTES, MAX_FILE_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    if ns.output:
        fd = os.open(ns.output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    os.execvp(command[0], command)


def _tasks_of(uid: int) -> int:
    """Tasks (threads) that user ``uid`` has now: what ``RLIMIT_NPROC`` counts."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"{entry.path}/status") as handle:
                status = dict(line.split(":", 1) for line in handle.read().splitlines())
        except (OSError, ValueError):
            continue
        if int(status.get("Uid", "-1 ").split()[0]) == uid:
            count += int(status.get("Threads", "1"))
    return count


if __name__ == "__main__":
    main()
