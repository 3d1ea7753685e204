"""What the grader cannot read statically in a student's notebook: flags for review, never a pass.

:mod:`transformer_lab.grading.authorship` decides, from the notebook's source, whether a part
reaches what its bans refuse. What it cannot follow (attribute access by a computed name,
``exec``/``eval``/``compile``, threads, TorchScript and ``torch.compile``, switching torch's
function hooks or any private ``torch._`` name, importing the kit's check machinery or a module
the grader does not have, a pasted table of numbers, a magic that runs code out of sight, a
cell that is not Python after IPython's transformations) is a flag here: the submission's
autograded points are withheld until an instructor reviews it.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import sys
from collections.abc import Iterator

from transformer_lab.grading.authorship import (
    MAGIC_CALLS,
    SHELL_CALLS,
    Cell,
    dotted_name,
    import_aliases,
    imported_names,
    resolved_name,
)

__all__ = ["review_flags"]

#: Modules whose use runs the student's code where the kernel's ban does not look.
_THREAD_MODULES = frozenset({"threading", "_thread", "concurrent", "asyncio", "queue"})
#: Builtins that run or reach code the scan cannot read.
_DYNAMIC_CALLS = {
    "exec": "runs code from a string (exec)",
    "eval": "runs code from a string (eval)",
    "compile": "compiles code from a string (compile)",
    "__import__": "imports a module by a computed name (__import__)",
    "globals": "reaches names through globals()",
    "breakpoint": "stops in the debugger (breakpoint)",
}
_ATTR_CALLS = frozenset({"getattr", "setattr", "delattr", "hasattr"})
_DYNAMIC_ATTRS = {
    "__getattribute__": "reads attributes by a computed name (__getattribute__)",
    "__dict__": "reads attributes through __dict__",
    "attrgetter": "reads attributes by name (operator.attrgetter)",
    "methodcaller": "calls methods by name (operator.methodcaller)",
}
#: torch's entry points that run code outside the hooks the kernel's ban uses.
_TORCH_ESCAPES = {
    "jit": "compiles with TorchScript (torch.jit)",
    "compile": "compiles with torch.compile",
    "fx": "traces with torch.fx",
    "overrides": "uses torch's function hooks (torch.overrides)",
    "library": "registers torch operators (torch.library)",
}
#: The kit's check machinery: never the student's to import.
_CHECK_MODULES = ("transformer_lab.checks", "transformer_lab.judge", "transformer_lab.grading")
_CHECK_NAMES = frozenset({"exempt", "unexempt", "forbidden", "enforced_here", "forwarded"})


def _is_ipython(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("get_ipython",)
    )


def _flags_of(node: ast.AST, aliases: dict[str, str]) -> Iterator[str]:
    """What in one node cannot be resolved statically (a few words each)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        name = node.func.id
        if name in _DYNAMIC_CALLS:
            yield _DYNAMIC_CALLS[name]
        if name == "vars" and node.args and resolved_name(dotted_name(node.args[0]), aliases):
            yield "reads a module's names through vars()"
        if name in _ATTR_CALLS and (
            len(node.args) < 2
            or not (isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str))
        ):
            yield f"reads attributes by a computed name ({name})"
    if isinstance(node, ast.Attribute):
        if node.attr in _DYNAMIC_ATTRS:
            yield _DYNAMIC_ATTRS[node.attr]
        if _is_ipython(node.value) and node.attr not in MAGIC_CALLS | SHELL_CALLS:
            yield f"drives the notebook's shell directly (get_ipython().{node.attr})"
        dotted = resolved_name(dotted_name(node), aliases)
        yield from _torch_flags(dotted)
        yield from _kit_flags(dotted)
    if isinstance(node, ast.Name):
        yield from _torch_flags(aliases.get(node.id, ""))
        yield from _kit_flags(aliases.get(node.id, ""))
    if isinstance(node, ast.Import | ast.ImportFrom):
        for dotted in imported_names(node):
            if dotted.split(".")[0] in _THREAD_MODULES:
                yield f"imports {dotted}: code in another thread runs outside the checks' bans"
            yield from _torch_flags(dotted)
            yield from _kit_flags(dotted)
            if dotted.rpartition(".")[2] in _CHECK_NAMES:
                yield f"imports the checks' {dotted.rpartition('.')[2]}"
        root = imported_names(node)[0].split(".")[0]
        if root and not _installed(root):
            yield f"imports {root}, a module the grader does not have (its code is unread)"


@functools.cache
def _installed(name: str) -> bool:
    """Whether the top-level module ``name`` is one the grader has (found, not imported)."""
    if name in sys.builtin_module_names:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _torch_flags(dotted: str) -> Iterator[str]:
    parts = dotted.split(".")
    if parts[0] != "torch":
        return
    for part in parts[1:]:
        if part in _TORCH_ESCAPES:
            yield _TORCH_ESCAPES[part]
            return
        if part.startswith("_") and not part.startswith("__"):
            yield f"uses torch's private internals ({dotted})"
            return


def _kit_flags(dotted: str) -> Iterator[str]:
    if dotted.startswith(_CHECK_MODULES):
        yield f"uses the kit's check machinery ({dotted})"


def review_flags(cells: list[Cell]) -> list[str]:
    """What the student's cells do that the grader cannot resolve statically, as ``cell N line
    L: what`` sentences (each a flag for review: the points are withheld until then)."""
    aliases = import_aliases(c.tree for c in cells)
    flags: list[str] = _tables([c for c in cells if c.student])
    for cell in cells:
        if not cell.student:
            continue
        flags += cell.flags
        shell = _shell_calls(cell.tree)
        for node in ast.walk(cell.tree):
            whats = list(_flags_of(node, aliases))
            if isinstance(node, ast.Name) and node.id == "get_ipython" and id(node) not in shell:
                whats.append("holds the notebook's shell (get_ipython) beyond a magic's call")
            for what in whats:
                flags.append(f"cell {cell.index} line {getattr(node, 'lineno', '?')}: {what}")
    return list(dict.fromkeys(flags))


#: How many number literals (other than small integers) the student's cells may hold before they
#: read as a
#: pasted table of answers (the visible checks' worked examples), and how long a string of
#: digits may be.
_MAX_NUMBERS = 48
_MAX_DIGIT_TEXT = 300


def _tables(cells: list[Cell]) -> list[str]:
    """Cells that hold a table of numbers rather than code computing them: a flag, since an
    answer that returns stored expected values passes the worked examples it was copied from."""
    nodes = [(c.index, n) for c in cells for n in ast.walk(c.tree)]
    numbers = [
        n.value
        for _, n in nodes
        if isinstance(n, ast.Constant)
        and isinstance(n.value, int | float)
        and not isinstance(n.value, bool)
        and not (isinstance(n.value, int) and -16 <= n.value <= 16)
    ]
    found = []
    if len(numbers) > _MAX_NUMBERS:
        found.append(f"your cells hold a table of {len(numbers)} numbers (pasted answers?)")
    for index, n in nodes:
        if isinstance(n, ast.Constant) and isinstance(n.value, str | bytes):
            text = n.value if isinstance(n.value, str) else n.value.decode("latin-1")
            digits = sum(ch.isdigit() for ch in text)
            if len(text) > _MAX_DIGIT_TEXT and digits > len(text) // 3:
                found.append(f"cell {index} line {n.lineno}: a long text of numbers (answers?)")
                break
    return found


def _shell_calls(tree: ast.AST) -> set[int]:
    """The ``get_ipython`` names of ``get_ipython().run_line_magic(...)`` and the other calls
    IPython's transformations write (by id): any other use of the shell is a flag."""
    return {
        id(node.value.func)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and _is_ipython(node.value)
        and node.attr in MAGIC_CALLS | SHELL_CALLS
    }
