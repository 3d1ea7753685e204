"""Where a submission's code runs: a kernel in an OS sandbox, limited in memory, CPU and time.

Grading runs untrusted code. Each submission's kernel is started (by nbgrader's ``Execute``, through
:class:`SandboxedKernelManager`) as::

    python -m transformer_lab.grading.limits ... -- bwrap <mounts> -- python -m \\
        transformer_lab.grading.guard -f <connection file>

* ``limits`` (this package) joins the submission's cgroups, sets the resource limits (address
  space, CPU seconds, file size, open files, tasks) and replaces itself with the sandbox;
* ``bwrap`` (bubblewrap, the sandbox of Flatpak; Debian package ``bubblewrap``) gives the kernel
  new namespaces: no network (loopback only), its own process tree, a private ``/tmp`` and
  ``/dev/shm`` of bounded size (``--size``, bubblewrap 0.5+), a read-only ``/dev``, and a
  file system of read-only system folders (``/usr``, the Python environment, the submission's
  copy of the grader's package tree of the lab) plus ONE writable folder, the submission's
  workspace. The course (other submissions, the gradebook, solutions, the kit's sources) is
  not there at all;
* the kernel talks to the grader over Unix sockets in the workspace (ZeroMQ's ``ipc``
  transport), since it has no network;
* :mod:`transformer_lab.grading.guard` then installs the tamper-evident audit hook before IPython.

After each test cell of a judged lab, :class:`BudgetedExecute` hands the cell to the judge
(:mod:`transformer_lab.grading.judge`), which runs the cell's trusted source in this process and
asks the kernel for the student's values through :class:`KernelLink`; a hidden test cell's
source is never sent to the kernel (it runs an empty stub there).

Where bubblewrap is missing (macOS, a container without user namespaces), grading refuses
unless asked for ``--unsandboxed``: then the same launcher, limits and containment
(:mod:`~transformer_lab.grading.contain`) without the namespaces, in the workspace as working
directory, and every report says "unsandboxed".

The total time a submission may take is bounded too (:class:`BudgetedExecute`): each cell gets at
most the time left, and cells after the budget or after the kernel died are marked as not run.
The judge of a test cell gets one deadline (the cell timeout or the time left) for all of its
requests together, checked while each exchange waits; a reply longer than the wire's
``MAX_BYTES`` is refused before it is parsed. The grader's own work around all of this runs in
a child process bounded in memory and time (:mod:`~transformer_lab.grading.isolate`).

Reference: bubblewrap(1); jupyter_client's ``KernelManager`` (``format_kernel_cmd``, ``transport``);
nbclient's ``NotebookClient.async_execute_cell``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import queue
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import zmq
import zmq.asyncio
from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import ensure_async, run_sync
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat import NotebookNode
from nbgrader.preprocessors import Execute
from traitlets import Dict, Float, Unicode

from transformer_lab.grading.course import BUDGET_S

NO_SANDBOX = (
    "bubblewrap (0.5 or later) does not work here and grading runs untrusted code: install it "
    "(Debian/Ubuntu: apt-get install bubblewrap), or pass --unsandboxed to grade without it"
)

#: Seconds the kernel has to leave its serving loop after a judged cell (then it is interrupted).
END_SERVING_S = 10.0

__all__ = [
    "BudgetedExecute",
    "KernelLink",
    "KernelSandbox",
    "SandboxedKernelManager",
    "find_bwrap",
    "python_executable",
]

#: Output names of the cells the grader did not run to the end, and why.
TIMEOUT_ENAMES = ("CellTimeoutError", "TimeBudgetExceeded")
DEAD_ENAME = "DeadKernelError"


@functools.cache
def find_bwrap() -> str | None:
    """The path of a working ``bwrap``, or None (missing, or the kernel refuses namespaces)."""
    path = shutil.which("bwrap")
    if path is None:
        return None
    try:
        # --size (a bounded tmpfs) needs bubblewrap 0.5 or later.
        sized_tmp = ["--size", "65536", "--tmpfs", "/tmp"]
        probe = subprocess.run(
            [path, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", *sized_tmp, "true"],
            capture_output=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return path if probe.returncode == 0 else None


@dataclass
class KernelSandbox:
    """Everything needed to start one submission's kernel.

    Attributes:
        workspace: the only writable folder (the kernel's working directory and home).
        run_dir: short folder for the kernel's sockets, connection file, guard config and log.
        python_path: folders put first on the kernel's ``PYTHONPATH`` (the grader's package tree).
        hidden: folders the kernel must not read from student code (the hidden checks).
        env: extra environment variables for the kernel.
        memory_bytes: address-space limit (0: none).
        cpu_seconds: CPU-time limit for the whole kernel (0: none).
        use_bwrap: run inside bubblewrap (False: unsandboxed, guard and limits only).
        masked: installed copies of the kit to hide inside the sandbox (tmpfs over them).
        max_tasks: ``RLIMIT_NPROC`` beyond the user's current tasks (0: none).
        tmp_bytes: size of the sandbox's ``/tmp`` (a RAM tmpfs; 0: the tmpfs default).
        shm_bytes: size of the sandbox's ``/dev/shm`` (0: the tmpfs default).
        launcher_args: more options for the launcher (the cgroups it joins).

    The address-space limit of each process is ``memory_bytes`` less the RAM file systems'
    sizes, so what a process maps and what it writes to ``/tmp`` and ``/dev/shm`` stay within
    ``memory_bytes`` together; a cgroup's memory limit (:mod:`~transformer_lab.grading.contain`),
    where there is one, bounds all processes and the tmpfs pages together.
    """

    workspace: Path
    run_dir: Path
    python_path: list[Path] = field(default_factory=list)
    hidden: list[Path] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    memory_bytes: int = 0
    cpu_seconds: int = 0
    use_bwrap: bool = True
    masked: list[Path] = field(default_factory=list)
    max_tasks: int = 0
    tmp_bytes: int = 0
    shm_bytes: int = 0
    launcher_args: list[str] = field(default_factory=list)

    @property
    def connection_file(self) -> Path:
        return self.run_dir / "kernel.json"

    @property
    def socket_prefix(self) -> Path:
        return self.run_dir / "k"

    def read_roots(self) -> list[str]:
        """Folders the kernel's code may read (besides the workspace)."""
        roots = {
            sys.prefix,
            sys.base_prefix,
            sys.exec_prefix,
            sysconfig.get_paths()["stdlib"],
            *(str(p) for p in self.python_path),
            "/usr",
            "/lib",
            "/lib64",
            "/etc",
            "/proc",
            "/sys",
            "/dev",
            str(self.run_dir),
            str(self.tmp_dir),
        }
        return sorted(roots)

    @property
    def tmp_dir(self) -> Path:
        """The kernel's temporary folder: a private ``/tmp`` in the sandbox, else its own."""
        return Path("/tmp") if self.use_bwrap else self.run_dir.parent / "tmp"

    def command(self, kernel_argv: Sequence[str]) -> list[str]:
        """The full command line: limits, then (maybe) bubblewrap, then the guarded kernel."""
        limits = [python_executable(), "-m", "transformer_lab.grading.limits"]
        limits += ["--output", str(self.run_dir / "kernel-output.txt")]
        limits += ["--chdir", str(self.workspace), *self.launcher_args]
        if self.memory_bytes:
            limits += ["--memory", str(self.address_space())]
        if self.cpu_seconds:
            limits += ["--cpu", str(self.cpu_seconds)]
        if self.max_tasks:
            limits += ["--nproc", str(self.max_tasks)]
        limits.append("--")
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(self.workspace),
            "MPLCONFIGDIR": str(self.workspace / ".matplotlib"),
            "PYTHONPATH": os.pathsep.join(str(p) for p in self.python_path),
            "PYTHONNOUSERSITE": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "TMPDIR": str(self.tmp_dir),
            "LANG": "C.UTF-8",
            **self.env,
        }
        if not self.use_bwrap:
            self.tmp_dir.mkdir(exist_ok=True)
            exports = [f"{k}={v}" for k, v in env.items()]
            return [*limits, "/usr/bin/env", "-i", *exports, *kernel_argv]
        bwrap = find_bwrap()
        if bwrap is None:
            raise RuntimeError("bubblewrap is not available: grade with use_bwrap=False")
        # No --new-session: the grader interrupts a cell that runs too long by signalling the
        # kernel's process group. The kernel has no terminal to abuse.
        args = [bwrap, "--die-with-parent", "--unshare-all", "--clearenv"]
        for name in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc"):
            if os.path.exists(name):
                args += ["--ro-bind", name, name]
        args += ["--ro-bind", "/sys", "/sys", "--proc", "/proc", "--dev", "/dev"]
        # RAM file systems of a bounded size; /dev itself read-only (it is a tmpfs too).
        args += [*self._size(self.shm_bytes), "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
        # A private /tmp first: the folders below may live under the host's /tmp.
        args += [*self._size(self.tmp_bytes), "--tmpfs", "/tmp"]
        for name in sorted(
            {sys.base_prefix, sys.prefix, sys.exec_prefix, *map(str, self.python_path)}
        ):
            if os.path.exists(name):
                args += ["--ro-bind", name, name]
        for path in self.masked:
            if path.is_dir():
                args += ["--size", "4096", "--tmpfs", str(path), "--remount-ro", str(path)]
        for folder in (self.workspace, self.run_dir):
            args += ["--bind", str(folder), str(folder)]
        for key, value in env.items():
            args += ["--setenv", key, value]
        args += ["--chdir", str(self.workspace), "--"]
        return [*limits, *args, *kernel_argv]

    @staticmethod
    def _size(nbytes: int) -> list[str]:
        """bubblewrap's ``--size`` for the next tmpfs (bubblewrap 0.5 and later)."""
        return ["--size", str(nbytes)] if nbytes else []

    def address_space(self) -> int:
        """``RLIMIT_AS`` of each process: the memory budget less the RAM file systems."""
        ram_fs = self.tmp_bytes + self.shm_bytes if self.use_bwrap else 0
        return max(self.memory_bytes - ram_fs, self.memory_bytes // 2)


def python_executable() -> str:
    """This interpreter's path with ``..`` and ``.`` resolved, links kept.

    ``sys.executable`` keeps the path the interpreter was started by: ``../.venv/bin/python``
    run from ``benchmarks/`` gives ``.../benchmarks/../.venv/bin/python``, which does not
    exist inside the sandbox (the repository is not there). Links are kept because a
    virtual environment's ``python`` is a link whose target would lose the environment.
    """
    return os.path.normpath(os.path.abspath(sys.executable))


class SandboxedKernelManager(AsyncKernelManager):
    """A kernel manager that starts the guarded kernel inside a :class:`KernelSandbox`.

    Configured per submission (traitlets config ``SandboxedKernelManager.sandbox``: the
    sandbox's fields as strings and lists; ``guard_config``: the path of the guard's config).
    """

    sandbox = Dict(help="KernelSandbox fields").tag(config=True)
    guard_config = Unicode("", help="path of the guard's configuration file").tag(config=True)
    startup_timeout = Float(120.0).tag(config=True)

    def _sandbox(self) -> KernelSandbox:
        fields = dict(self.sandbox)
        for key in ("workspace", "run_dir"):
            fields[key] = Path(fields[key])
        for key in ("python_path", "hidden", "masked"):
            fields[key] = [Path(p) for p in fields.get(key, [])]
        return KernelSandbox(**fields)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        box = self._sandbox()
        self.transport = "ipc"
        self.ip = str(box.socket_prefix)
        self.connection_file = str(box.connection_file)
        # Interrupt a cell through the kernel's control channel: a signal from outside the
        # sandbox's process tree may not reach it.
        self.kernel_spec.interrupt_mode = "message"

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        box = self._sandbox()
        box.env = {**box.env, "TRANSFORMER_LAB_GUARD": self.guard_config}
        # A judged lab needs no guard in the kernel: nothing there decides a point.
        launcher = "transformer_lab.grading.guard" if self.guard_config else "ipykernel_launcher"
        kernel = [
            python_executable(),
            "-m",
            launcher,
            "-f",
            str(box.connection_file),
            *(extra_arguments or []),
        ]
        return box.command(kernel)


def _error_output(ename: str, evalue: str) -> NotebookNode:
    return NotebookNode(
        output_type="error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"]
    )


class BudgetedExecute(Execute):
    """nbgrader's ``Execute`` in the sandbox, with one time budget for the whole submission.

    Each cell may run for the configured cell timeout or the time left, whichever is shorter; a
    cell reached after the budget is spent, or after the kernel died, is not run and gets an
    error output that says why (``TimeBudgetExceeded``, ``DeadKernelError``). Threads are pinned
    by the kernel's environment (``TRANSFORMER_LAB_THREADS``, ``OMP_NUM_THREADS``).
    """

    budget = Float(BUDGET_S, help="seconds a whole submission may run").tag(config=True)
    judge_plan = Unicode(
        "", help="JSON file {grade_id: trusted source} of the test cells the judge decides"
    ).tag(config=True)
    verdicts_path = Unicode("", help="where the judge's verdicts are written (JSON)").tag(
        config=True
    )
    finish_source = Unicode("", help="the grader's closing cell, run after the notebook").tag(
        config=True
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["kernel_manager_class"] = SandboxedKernelManager
        super().__init__(*args, **kwargs)
        self._started = 0.0
        self._dead = ""
        self._cell_timeout = self.timeout

    def preprocess(
        self, nb: NotebookNode, resources: Any = None, km: Any = None
    ) -> tuple[NotebookNode, Any]:
        """Run the notebook, then the closing cell (which is removed again afterwards)."""
        self._started, self._dead, self._cell_timeout = 0.0, "", self.timeout
        self._serving: str | None = None  # the msg_id of the kernel's serving loop, if one runs
        self._waiting = False  # whether that loop waits for the judge's next request
        self._plan = json.loads(Path(self.judge_plan).read_text()) if self.judge_plan else {}
        from transformer_lab.grading.judge import Judgements

        self._judgements = Judgements()  # in the notebook's order
        if self.finish_source:
            closing = nbformat.v4.new_code_cell(self.finish_source)
            closing.metadata["transformer_lab_finish"] = True
            nb.cells.append(closing)
        try:
            return super().preprocess(nb, resources, km)
        finally:
            if self.verdicts_path:
                Path(self.verdicts_path).write_text(json.dumps(self._judgements.verdicts, indent=1))
            nb.cells = [
                c for c in nb.cells if not c.get("metadata", {}).get("transformer_lab_finish")
            ]

    @property
    def dead(self) -> str:
        """Why the kernel died, or ``""``."""
        return self._dead

    async def async_execute_cell(
        self,
        cell: NotebookNode,
        cell_index: int,
        execution_count: int | None = None,
        store_history: bool = True,
    ) -> NotebookNode:
        run = super().async_execute_cell
        if cell.cell_type != "code" or not cell.source.strip():
            return await run(cell, cell_index, execution_count, store_history)
        if not self._started:
            self._started = time.monotonic()
        if self._dead:
            cell.outputs = [_error_output(DEAD_ENAME, f"not run: {self._dead}")]
            return cell
        left = self.budget - (time.monotonic() - self._started)
        if left <= 1:
            message = f"not run: the submission used its whole time budget of {self.budget:g} s"
            cell.outputs = [_error_output("TimeBudgetExceeded", message)]
            return cell
        self.timeout = int(min(self._cell_timeout or left, left))
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")
        judged = grade_id in self._plan
        source = cell.source
        if judged and self._plan[grade_id]["hidden"]:
            cell.source = "# hidden check: judged by the grader, outside this notebook"
        try:
            return await run(cell, cell_index, execution_count, store_history)
        except DeadKernelError as exc:
            self._dead = f"the kernel died while cell {cell_index + 1} ran ({exc})"
            cell.outputs = [*cell.get("outputs", []), _error_output(DEAD_ENAME, self._dead)]
            return cell
        except ValueError as exc:
            if "Signature" not in str(exc):
                raise
            # A message without the kernel's signature (a forked child writing to its sockets):
            # nothing later can be trusted to run in it.
            self._dead = (
                f"the kernel sent a message the grader cannot authenticate in cell {cell_index + 1}"
            )
            cell.outputs = [*cell.get("outputs", []), _error_output(DEAD_ENAME, self._dead)]
            return cell
        except CellTimeoutError:
            # The kernel stopped answering altogether (not even its output channel): nothing
            # later can run in it.
            self._dead = f"the kernel stopped answering in cell {cell_index + 1}"
            message = "no reply from the kernel before the timeout; the kernel stopped answering"
            cell.outputs = [*cell.get("outputs", []), _error_output("CellTimeoutError", message)]
            return cell
        finally:
            cell.source = source
            if judged and not self._dead:
                await self._judge(grade_id)

    async def _judge(self, grade_id: str) -> None:
        """The judge's verdict on one test cell, from requests to the live kernel."""
        from transformer_lab.grading.judge import JudgeSession

        left = self.budget - (time.monotonic() - self._started)
        timeout = max(1.0, min(float(self._cell_timeout or left), left))
        loop = asyncio.get_running_loop()
        hidden = bool(self._plan[grade_id]["hidden"])
        session = JudgeSession(KernelLink(self, loop), timeout, hidden=hidden)
        source = self._plan[grade_id]["source"]
        try:
            await loop.run_in_executor(None, self._judgements.judge, grade_id, source, session)
        finally:
            await self._end_serving()

    async def exchange(self, text: str, timeout: float, answer: Callable[[str], str]) -> str:
        """One judge request, served by the kernel's serving loop of this cell; the reply text.

        The first request of a cell starts the loop (``serve_loop()``, silent, outside the
        kernel's history), which fetches it through the input channel; every later one answers
        the input prompt that carried the last reply. While a request runs, the kernel's calls
        back to the grader's objects arrive as input requests too; ``answer`` (run in a worker
        thread) answers each.
        """
        from transformer_lab.grading.judge import JudgeError
        from transformer_lab.judge.kernel import CALLBACK_PREFIX, REPLY_PREFIX, REQUEST_PROMPT

        if self._serving is not None and not self._waiting:
            await self._end_serving()  # a loop left mid-request (a timeout): end it first
        if self._dead:
            raise JudgeError(self._dead)
        unsent: str | None = None
        if self._serving is None:
            code = "import transformer_lab.judge.kernel as _tl_judge\n_tl_judge.serve_loop()"
            self._serving = self.kc.execute(
                code, silent=True, store_history=False, allow_stdin=True
            )
            unsent = text
        else:
            self.kc.input(text)  # the kernel waits for it at the prompt of its last reply
        self._waiting = False
        loop = asyncio.get_running_loop()
        poller = self._poller()
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                await ensure_async(self.km.interrupt_kernel())
                raise JudgeError(f"your code did not return within {timeout:.0f} s")
            # Short waits, as a missed wake-up must not cost more than 2 ms.
            ready = await self._ready(poller, min(remaining, 0.002))
            request = await self._next(self.kc.stdin_channel, 0.0) if "stdin" in ready else None
            if request is not None and request.get("msg_type") == "input_request":
                prompt = str(request.get("content", {}).get("prompt", ""))
                if prompt.startswith(REPLY_PREFIX):
                    self._waiting = True
                    return _reply_text(prompt[len(REPLY_PREFIX) :])
                reply = ""
                if prompt == REQUEST_PROMPT:
                    reply, unsent = unsent or "", None
                elif prompt.startswith(CALLBACK_PREFIX):
                    reply = await loop.run_in_executor(None, answer, prompt[len(CALLBACK_PREFIX) :])
                self.kc.input(reply)
                continue
            msg = await self._next(self.kc.shell_channel, 0.0) if "shell" in ready else None
            if msg is None:
                if not await ensure_async(self.km.is_alive()):
                    self._dead = "the kernel died while the grader's judge ran your code"
                    raise JudgeError(self._dead)
                continue
            if msg.get("parent_header", {}).get("msg_id") == self._serving:
                self._serving = None
                raise JudgeError("your notebook's kernel stopped answering the judge's requests")

    async def _end_serving(self) -> None:
        """End the kernel's serving loop of this cell, if one runs, so the next cell can run.

        Every input request still coming (a reply to a request the judge gave up on, a call back)
        is answered with the end marker. A loop that does not end within
        :data:`END_SERVING_S` is interrupted once; a kernel that still does not answer is dead.
        """
        from transformer_lab.judge.kernel import END

        if self._serving is None or self._dead:
            self._serving, self._waiting = None, False
            return
        if self._waiting:
            self.kc.input(END)
        poller, interrupted = self._poller(), False
        deadline = time.monotonic() + END_SERVING_S
        while self._serving is not None:
            if time.monotonic() > deadline:
                if interrupted:
                    self._dead = "the kernel stopped answering after the grader's judge ran"
                    break
                await ensure_async(self.km.interrupt_kernel())
                interrupted, deadline = True, time.monotonic() + END_SERVING_S
            ready = await self._ready(poller, 0.01)
            request = await self._next(self.kc.stdin_channel, 0.0) if "stdin" in ready else None
            if request is not None and request.get("msg_type") == "input_request":
                self.kc.input(END)
            msg = await self._next(self.kc.shell_channel, 0.0) if "shell" in ready else None
            if msg is not None and msg.get("parent_header", {}).get("msg_id") == self._serving:
                self._serving = None
            elif msg is None and not await ensure_async(self.km.is_alive()):
                self._dead = "the kernel died while the grader's judge ran your code"
                break
        self._serving, self._waiting = None, False

    def _poller(self) -> zmq.asyncio.Poller:
        """A poller of the kernel's stdin and shell sockets (one per exchange)."""
        poller = zmq.asyncio.Poller()
        for socket in (self.kc.stdin_channel.socket, self.kc.shell_channel.socket):
            poller.register(socket, zmq.POLLIN)
        return poller

    async def _ready(self, poller: zmq.asyncio.Poller, timeout: float) -> set[str]:
        """Which of the kernel's stdin and shell channels have a message, waiting on both at
        once up to ``timeout`` s (a call back from the kernel, a model's forward, waits for
        this loop: it must wake as soon as either arrives)."""
        events = dict(await poller.poll(int(timeout * 1000)))
        channels = {"stdin": self.kc.stdin_channel.socket, "shell": self.kc.shell_channel.socket}
        return {name for name, socket in channels.items() if events.get(socket)}

    @staticmethod
    async def _next(channel: Any, timeout: float) -> dict[str, Any] | None:
        """The channel's next message; None when there is none, or it is not signed."""
        try:
            return await ensure_async(channel.get_msg(timeout=timeout))
        except queue.Empty:
            return None
        except ValueError:  # an unsigned message (a forked child's): never the reply
            return None

    # nbclient binds the synchronous wrapper to its own coroutine: bind it to this one.
    execute_cell = run_sync(async_execute_cell)


def _reply_text(text: str) -> str:
    """The kernel's reply, bounded in size (what it means is the judge's to read)."""
    from transformer_lab.grading.judge import JudgeError
    from transformer_lab.judge.wire import MAX_BYTES

    if len(text) > MAX_BYTES:
        raise JudgeError("your notebook's kernel answered the judge with too much data")
    return text


class KernelLink:
    """The judge's :class:`~transformer_lab.grading.judge.Link` to a running notebook's kernel.

    The judge runs in a worker thread; each exchange is scheduled on the executor's event loop,
    which owns the kernel's channels.
    """

    def __init__(self, executor: BudgetedExecute, loop: asyncio.AbstractEventLoop) -> None:
        self.executor, self.loop = executor, loop

    def exchange(self, text: str, timeout: float, answer: Callable[[str], str]) -> str:
        coroutine = self.executor.exchange(text, timeout, answer)
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout + 60)
