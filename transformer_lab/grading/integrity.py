"""Flags for an instructor's review: the guard's log (unsandboxed grading) and a static scan.

No point is decided here: every autograded point is the judge's
(:mod:`transformer_lab.grading.judge`). What is left is help for review. Without the OS sandbox
the kernel runs under the guard, a fence around files and processes; the grader (this side)
prepares its :class:`GuardPlan` (a fresh secret key, a nonce for the closing cell, the digests of
the notebook's locked cells), and :func:`read_log` verifies the guard's records (MAC, sequence,
start and closing records) and reads what it refused or saw tampered with, which the grader
turns into flags.

:func:`scan_student_code` reads the student's cells (answer cells and any cell the student added)
for the constructs a cheat needs: assigning to a module the checks use, ``sys.modules``,
``builtins``, the notebook's execution hooks, ``os._exit``, tracing, frames and code objects,
PyTorch's dispatch internals, the grader's own modules, the course's files. They are reported as
flags (and make the submission's autograded score zero until an instructor reviews it).
"""

from __future__ import annotations

import ast
import hashlib
import hmac
import json
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from nbformat import NotebookNode

from transformer_lab.grading.authorship import python_cells, transformed
from transformer_lab.grading.guard import FINISH_EVENT, cell_digest
from transformer_lab.grading.unreadable import review_flags
from transformer_lab.pysource import parse_python

__all__ = [
    "GuardPlan",
    "LogReading",
    "plan_for",
    "read_log",
    "scan_student_code",
]


def _meta(cell: NotebookNode) -> dict:
    meta = cell.get("metadata", {}).get("nbgrader")
    return meta if isinstance(meta, dict) else {}


@dataclass
class GuardPlan:
    """What the grader tells the guard (the fence of unsandboxed grading).

    Attributes:
        key: hex secret of the records' MACs (never in the notebook).
        nonce: the closing cell's secret word.
        trusted_cells: digest of a locked cell's source -> its grade id.
    """

    key: str
    nonce: str
    trusted_cells: dict[str, str]

    def guard_config(self, lab: str, **paths: object) -> dict:
        """The guard's configuration (written to a file the kernel deletes after reading)."""
        return {
            "key": self.key,
            "lab": lab[:2],
            "trusted_cells": {**self.trusted_cells, cell_digest(self.finish_source): "finish"},
            "finish": cell_digest(self.nonce),
            **paths,
        }

    @property
    def finish_source(self) -> str:
        return f'__import__("sys").audit("{FINISH_EVENT}", "{self.nonce}")'


def plan_for(source: NotebookNode, lab: str) -> GuardPlan:
    """A fresh :class:`GuardPlan` for one submission of ``lab`` (source notebook with tests)."""
    trusted = {}
    for cell in source.cells:
        meta = _meta(cell)
        if cell.cell_type == "code" and meta.get("locked"):
            trusted[cell_digest(cell.source)] = meta.get("grade_id", "")
    return GuardPlan(secrets.token_hex(32), secrets.token_hex(16), trusted)


@dataclass
class LogReading:
    """The verified records of a guard log and what was wrong with the log itself."""

    records: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    started: bool = False
    finished: bool = False

    def of(self, event: str) -> list[dict]:
        return [r for r in self.records if r.get("event") == event]


def read_log(path: Path, key: str) -> LogReading:
    """Read and verify the guard's log at ``path`` (MACs, sequence, start, closing record)."""
    reading = LogReading()
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        reading.problems.append("the guard's log is missing (the kernel never started properly)")
        return reading
    expected_seq = 1
    secret = bytes.fromhex(key)
    for number, line in enumerate(lines, start=1):
        body, _, mac = line.rpartition("\t")
        want = hashlib.blake2b(body.encode(), key=secret, digest_size=16).hexdigest()
        if not body or not hmac.compare_digest(mac, want):
            reading.problems.append(f"log line {number} was not written by the guard (forged)")
            continue
        record = json.loads(body)
        if record.get("seq") != expected_seq:
            reading.problems.append(
                f"the guard's log skips from record {expected_seq - 1} to {record.get('seq')}"
            )
        expected_seq = int(record.get("seq", expected_seq)) + 1
        reading.records.append(record)
    reading.started = bool(reading.of("start"))
    reading.finished = bool(reading.of("finish"))
    if not reading.started:
        reading.problems.append("the guard's log has no start record")
    return reading


# --------------------------------------------------------------------------------------
# Static scan of the student's code
# --------------------------------------------------------------------------------------

# Names whose attributes a submission must not assign to (the modules the checks rely on).
_PROTECTED_ROOTS = {
    "torch", "F", "nn", "math", "np", "numpy", "sys", "builtins", "transformer_lab", "lab",
    "plots", "diagrams", "plt", "os", "importlib", "types",
}  # fmt: skip
_FORBIDDEN_NAMES = {
    "__builtins__": "uses __builtins__",
    "__code__": "reads or replaces a function's code (__code__)",
    "__globals__": "reaches into a function's globals (__globals__)",
    "__closure__": "reaches into a function's closure (__closure__)",
    "tb_frame": "walks the interpreter's frames (tb_frame)",
    "f_back": "walks the interpreter's frames (f_back)",
    "f_globals": "reads another frame's globals (f_globals)",
    "f_locals": "reads another frame's variables (f_locals)",
    "_getframe": "walks the interpreter's frames (sys._getframe)",
    "settrace": "installs a tracer (settrace)",
    "setprofile": "installs a profiler (setprofile)",
    "addaudithook": "installs an audit hook",
    "set_custom_exc": "hides exceptions from the grader (set_custom_exc)",
    "__torch_function__": "intercepts torch calls (__torch_function__)",
    "__torch_dispatch__": "intercepts torch calls (__torch_dispatch__)",
    "TorchFunctionMode": "intercepts torch calls (TorchFunctionMode)",
    "TorchDispatchMode": "intercepts torch calls (TorchDispatchMode)",
    "_python_dispatch": "uses torch's dispatch internals",
    "DisableTorchFunction": "switches off torch's function hooks",
    "_disable_current_modes": "switches off torch's dispatch hooks",
    "_exit": "kills the kernel (os._exit)",
    "get_referrers": "searches the interpreter's objects (gc)",
    "get_objects": "searches the interpreter's objects (gc)",
}
_FORBIDDEN_MODULES = {
    "ctypes", "gc", "sqlite3", "subprocess", "socket", "signal", "pty", "multiprocessing",
    "inspect", "importlib", "shutil", "unittest",
}  # fmt: skip
_FORBIDDEN_TEXT = {
    "transformer_lab.grading": "imports the grader's own modules",
    "hidden_check": "calls the hidden checks",
    "oracle_": "calls the grader's oracles",
    "gradebook": "touches the gradebook",
    "solutions/": "reads the course's solutions",
    "submitted/": "touches other submissions",
    "sys.modules": "changes sys.modules",
    "torch.ops.": "calls torch's operators directly (torch.ops), past the checks' bans",
    "torch._C.": "calls torch's C internals (torch._C), past the checks' bans",
}
_HOOK_ATTRS = {"run_cell", "run_cell_async", "events", "input_transformers_post",
               "input_transformers_cleanup", "ast_transformers", "showtraceback"}  # fmt: skip


def _student_cells(submission: NotebookNode) -> Iterable[tuple[int, NotebookNode]]:
    """Code cells the student wrote: answer cells and cells without grading metadata."""
    for index, cell in enumerate(submission.cells, start=1):
        if cell.cell_type != "code":
            continue
        meta = _meta(cell)
        if meta.get("solution") or not meta:
            yield index, cell


def _imported_names(submission: NotebookNode) -> set[str]:
    """Names bound by an import anywhere in the notebook (modules, and what was taken from them)."""
    names: set[str] = set()
    for cell in submission.cells:
        if cell.cell_type != "code":
            continue
        try:
            tree = parse_python(transformed(cell.source))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                names |= {a.asname or a.name for a in node.names}
    return names


def scan_student_code(submission: NotebookNode) -> list[str]:
    """Flags for constructs a cheat needs, as ``cell N line L: what`` sentences.

    Assigning to an attribute of anything the notebook imported (``torch.allclose = ...``,
    ``lab01.check_x = ...``, ``posixpath.os = ...``) counts as changing what the checks use.
    """
    flags: list[str] = []
    protected = _PROTECTED_ROOTS | _imported_names(submission)
    cells = python_cells(submission)
    trees = {cell.index: cell.tree for cell in cells if cell.student}
    for index, cell in _student_cells(submission):
        source = cell.source
        for needle, what in _FORBIDDEN_TEXT.items():
            if needle in source:
                line = next(i for i, t in enumerate(source.splitlines(), 1) if needle in t)
                flags.append(f"cell {index} line {line}: {what} ({needle!r})")
        for node in ast.walk(trees[index]):
            where = f"cell {index} line {getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Attribute | ast.Name):
                name = node.attr if isinstance(node, ast.Attribute) else node.id
                if name in _FORBIDDEN_NAMES:
                    flags.append(f"{where}: {_FORBIDDEN_NAMES[name]}")
                if (
                    isinstance(node, ast.Attribute)
                    and name in _HOOK_ATTRS
                    and "get_ipython" in ast.unparse(node.value)
                ):
                    flags.append(f"{where}: changes how the notebook runs cells ({name})")
            if isinstance(node, ast.Import | ast.ImportFrom):
                modules = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                )
                for module in modules:
                    if module.split(".")[0] in _FORBIDDEN_MODULES or module == "builtins":
                        flags.append(f"{where}: imports {module}")
            if isinstance(node, ast.Assign | ast.AugAssign | ast.Delete | ast.AnnAssign):
                targets = (
                    node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
                )
                for target in targets:
                    root = target
                    while isinstance(root, ast.Attribute | ast.Subscript):
                        root = root.value
                    if (
                        isinstance(target, ast.Attribute | ast.Subscript)
                        and isinstance(root, ast.Name)
                        and (root.id in protected or root.id.startswith(("lab", "hidden")))
                    ):
                        flags.append(f"{where}: changes {ast.unparse(target)}")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("setattr", "delattr")
                and node.args
            ):
                root = node.args[0]
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(root, ast.Name) and (
                    root.id in protected or root.id.startswith(("lab", "hidden"))
                ):
                    flags.append(f"{where}: changes {ast.unparse(node.args[0])} with setattr")
    flags += review_flags(cells)
    return list(dict.fromkeys(flags))
