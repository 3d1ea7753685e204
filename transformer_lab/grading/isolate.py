"""The grader's own work on one submission, in a child process bounded in memory and time.

Grading a submission makes the grader read what the student chose: it repairs the notebook
(:mod:`~transformer_lab.grading.repair`), decodes the kernel's replies
(:mod:`~transformer_lab.judge.wire`) and renders the feedback. The kernel is sandboxed and
limited; this is the grader's side of the same bound. :func:`run_bounded` runs that work in a
forked child of the grader,

* under an address-space limit (``RLIMIT_AS``, the *soft* limit only, so that the kernel's
  launcher, :mod:`~transformer_lab.grading.limits`, can still give the kernel its own);
* before a wall-clock deadline: past it the child is asked to stop (``SIGTERM``, which unwinds
  its clean-up: the kernel's processes are ended) and, after a grace period, it and everything
  below it are killed;

and reads its result back through a pipe. An exception, a ``MemoryError``, the system's
out-of-memory killer or a hang there costs that submission only: the grader's process is
untouched, the failure is the submission's result, and the batch goes on.

Forked, not spawned: the child inherits what the grader imported once (torch, the checks,
Lightning: :func:`~transformer_lab.grading.grade.warm_judge`), so the bound costs milliseconds.
The grader's process only imports before it forks (it computes nothing with torch, opens no
kernel), so the child starts with no thread pool or socket of its parent's in use.

Reference: setrlimit(2) ``RLIMIT_AS``; :mod:`multiprocessing`'s ``fork`` context and ``Pipe``.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import resource
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transformer_lab.grading.contain import descendants

__all__ = ["Bounds", "Outcome", "Stopped", "describe", "run_bounded"]

#: Seconds the child has to stop after ``SIGTERM`` before it is killed.
GRACE_S = 10.0


class Stopped(BaseException):
    """Raised in the child when the grader stops it (its deadline passed): not an ``Exception``,
    so that no ``except Exception`` of the work swallows it; ``finally`` blocks still run."""


@dataclass(frozen=True)
class Bounds:
    """What the grader's work on one submission may use.

    Attributes:
        memory_bytes: address space of the child (0: no limit).
        seconds: wall-clock time from the child's start.
        grace_s: time to stop after being asked, before it is killed.
    """

    memory_bytes: int
    seconds: float
    grace_s: float = GRACE_S


@dataclass
class Outcome:
    """What the child gave back: ``value``, or ``failure`` saying why there is none."""

    value: Any = None
    failure: str = ""

    @property
    def ok(self) -> bool:
        return not self.failure


def describe(exc: BaseException, memory_bytes: int = 0) -> str:
    """One line saying what an exception of the grader's own work means."""
    if isinstance(exc, MemoryError):
        limit = f" (its limit: {memory_bytes / 2**30:g} GiB)" if memory_bytes else ""
        return f"the grader's work on this submission ran out of memory{limit}"
    text = " ".join(str(exc).split())[:2000]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def run_bounded(func: Callable[[Any], Any], arg: Any, bounds: Bounds) -> Outcome:
    """``func(arg)`` in a forked child within ``bounds``; its value, or why there is none.

    ``func``'s value must be picklable. Never raises for what happens in the child.
    """
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(func, arg, bounds.memory_bytes, sender))
    with _children_allowed():
        child.start()
    sender.close()
    try:
        if receiver.poll(bounds.seconds):
            return _received(receiver, child, bounds)
        _stop(child, bounds.grace_s)
        return Outcome(
            failure=f"the grader stopped its work on this submission at its deadline of "
            f"{bounds.seconds:g} s (the time budget and the kernel's start together)"
        )
    finally:
        receiver.close()
        child.join(bounds.grace_s)
        if child.is_alive():
            _kill_tree(child.pid)
            child.join()


@contextlib.contextmanager
def _children_allowed() -> Any:
    """Let a daemonic process (a Dask worker under its nanny) start the child.

    :mod:`multiprocessing` refuses children to a daemonic process because its termination would
    orphan them; :func:`run_bounded` never leaves one behind (it joins the child, or kills it and
    everything below it, before it returns), so the refusal does not apply here. The flag is
    ``multiprocessing``'s own (``process._config``), set back as it was once the child started.
    """
    config = multiprocessing.current_process()._config  # type: ignore[attr-defined]
    daemon = config.get("daemon")
    config["daemon"] = False
    try:
        yield
    finally:
        if daemon is None:
            config.pop("daemon", None)
        else:
            config["daemon"] = daemon


def _received(receiver: Any, child: Any, bounds: Bounds) -> Outcome:
    """The child's message, or (it died without one) how it ended."""
    try:
        ok, payload = receiver.recv()
    except (EOFError, OSError):
        child.join(bounds.grace_s)
        return Outcome(failure=_death(child.exitcode, bounds.memory_bytes))
    except Exception as exc:  # a result that could not be read back
        return Outcome(failure=f"the grader could not read its own result ({describe(exc)})")
    return Outcome(value=payload) if ok else Outcome(failure=str(payload))


def _death(code: int | None, memory_bytes: int) -> str:
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        if -code == signal.SIGKILL:
            limit = f"{memory_bytes / 2**30:g} GiB limit or the " if memory_bytes else ""
            return (
                f"the grader's work on this submission was killed ({name}: most likely its "
                f"{limit}system's out-of-memory killer)"
            )
        return f"the grader's work on this submission was killed ({name})"
    return f"the grader's work on this submission ended without a result (exit code {code})"


def _child(func: Callable[[Any], Any], arg: Any, memory_bytes: int, sender: Any) -> None:
    signal.signal(signal.SIGTERM, _raise_stopped)
    if memory_bytes:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        soft = memory_bytes if hard == resource.RLIM_INFINITY else min(memory_bytes, hard)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    try:
        message: tuple[bool, Any] = (True, func(arg))
    except BaseException as exc:  # the grader's failure: said, never raised
        message = (False, describe(exc, memory_bytes))
    try:
        sender.send(message)
    except Exception as exc:  # too large, or memory ran out while sending
        with contextlib.suppress(Exception):
            sender.send((False, f"the grader could not send its result ({describe(exc)})"))
    finally:
        sender.close()


def _raise_stopped(signum: int, frame: Any) -> None:
    raise Stopped("stopped at the deadline")


def _stop(child: Any, grace_s: float) -> None:
    """Ask the child to stop; kill it and everything below it if it has not within ``grace_s``."""
    with contextlib.suppress(OSError):
        os.kill(child.pid, signal.SIGTERM)
    child.join(grace_s)
    if child.is_alive():
        _kill_tree(child.pid)


def _kill_tree(pid: int) -> None:
    """``SIGKILL`` every process below ``pid`` (repeatedly: they may fork), then ``pid``.

    ``pid`` is stopped first, so that it starts nothing while its descendants are killed.
    """
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGSTOP)
    for _ in range(200):
        alive = [p for p, state in descendants(pid).items() if state != "Z"]
        if not alive:
            break
        for p in alive:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        time.sleep(0.01)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
