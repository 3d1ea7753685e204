"""Start a command with resource limits: ``python -m transformer_lab.grading.limits [opts] -- cmd``.

The grader starts each submission's kernel through this module, which sets the limits with
``resource.setrlimit`` and then replaces itself with the command (``os.execvp``), so the limits
hold for the sandbox and the kernel inside it:

* ``--memory BYTES``: address space (a runaway allocation fails with ``MemoryError``);
* ``--cpu SECONDS``: CPU time of the kernel (it is killed after that, whatever it does);
* ``--output FILE``: the command's standard output and error go there (the kernel's own
  messages, a crash's last words), not to the grader's terminal;
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
    ns = parser.parse_args(args[:cut])
    command = args[cut + 1 :]
    if not command:
        raise SystemExit("transformer_lab.grading.limits: no command after --")
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


if __name__ == "__main__":
    main()
