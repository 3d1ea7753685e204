"""What a saved answer needs, read from the student's own cells (their syntax tree), not guessed.

An answer cell defines a function or class that uses names bound elsewhere in the notebook: the
setup cell's imports (``import lightning as L``), a constant (``END_OF_WORD = "</w>"``), a helper
function of the student's. :func:`needed` reads the cells the kernel ran (IPython's ``In``, in
the order they ran), finds the statement that bound each name the answer uses (Python's own
:mod:`symtable` says which names those are: local names and annotations do not count), then what
those statements use, and so on; the statements come back in the order written. Carried are:

* imports, of any library (nothing is allow-listed), and function and class definitions;
* assignments whose values are constants (numbers, strings, tensors, patterns..., built from
  other carried names only): a saved file must not rerun ``session = lab.setup(...)`` or a
  training cell.

A name that no carried statement binds is written from the namespace where it can be: a module
or an importable function or class as an import, a literal as an assignment. Any other name is
returned as missing, so that the student hears of it when the answer is saved (its passing
check), not two labs later when the saved file fails to run.
"""

from __future__ import annotations

import ast
import builtins
import enum
import functools
import importlib
import re
import symtable
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from transformer_lab.pysource import parse_python

__all__ = [
    "Needs",
    "Statement",
    "cell_sources",
    "is_constant",
    "namespace_line",
    "needed",
    "statements",
]

_FUTURE = "from __future__ import annotations\n"


@dataclass(frozen=True)
class Statement:
    """One top-level statement of a cell (or of a saved file).

    Attributes:
        position: its place in the history, in the order the cells ran.
        source: its text (a definition's decorators included).
        kind: ``"import"``, ``"definition"``, ``"assignment"`` or ``"other"`` (a loop, a
            ``try``, a call...: it binds names but is never carried).
        binds: the names it binds at the top level.
        now: names it reads when it runs (decorators, defaults, bases, a class body, a value).
        later: names its functions read when called.
        annotations: names read only by annotations (carried where they can be, never missing).
        trusted: from a saved file, whose assignments were found constant when it was saved.
    """

    position: int
    source: str
    kind: str
    binds: frozenset[str]
    now: frozenset[str]
    later: frozenset[str]
    annotations: frozenset[str]
    trusted: bool = False


@dataclass
class Needs:
    """What :func:`needed` found: statements to carry, import lines, and missing names."""

    statements: list[Statement] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)


def cell_sources(namespace: Mapping[str, Any]) -> list[str]:
    """The sources of the cells the kernel ran, in order (IPython's ``In``); [] elsewhere."""
    history = namespace.get("In", namespace.get("_ih"))
    if isinstance(history, list) and all(isinstance(cell, str) for cell in history):
        return [cell for cell in history if cell.strip()]
    return []


def statements(source: str, start: int = 0, *, trusted: bool = False) -> list[Statement]:
    """The top-level statements of ``source`` (none where it does not parse), numbered from
    ``start``."""
    return [
        Statement(start + i, *parsed, trusted=trusted) for i, parsed in enumerate(_parsed(source))
    ]


@functools.lru_cache(maxsize=512)
def _parsed(source: str) -> tuple[tuple[str, str, frozenset, frozenset, frozenset, frozenset], ...]:
    try:
        tree = parse_python(source)
    except (SyntaxError, ValueError):
        return ()
    lines = source.splitlines()
    out = []
    for node in tree.body:
        text = _text(node, source, lines)
        kind, binds = _kind(node)
        if kind == "other":
            binds = _top_level_binds(text)
        now, later, annotations = _uses(text)
        out.append((text, kind, binds, now, later, annotations))
    return tuple(out)


def _text(node: ast.stmt, source: str, lines: list[str]) -> str:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
        return "\n".join(lines[first : node.end_lineno])
    return ast.get_source_segment(source, node) or ""


def _kind(node: ast.stmt) -> tuple[str, frozenset[str]]:
    if isinstance(node, ast.Import):
        return "import", frozenset(a.asname or a.name.partition(".")[0] for a in node.names)
    if isinstance(node, ast.ImportFrom):
        if node.module == "__future__" or any(a.name == "*" for a in node.names):
            return "other", frozenset()
        return "import", frozenset(a.asname or a.name for a in node.names)
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return "definition", frozenset({node.name})
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AnnAssign | ast.AugAssign) and node.value is not None:
        targets = [node.target]
    names = [n for t in targets for n in ast.walk(t)]
    if targets and all(isinstance(n, _NAME_TARGETS) for n in names):
        return "assignment", frozenset(n.id for n in names if isinstance(n, ast.Name))
    return "other", frozenset()  # x[0] = ..., obj.attr = ...: not a constant's definition


#: What an assignment's targets may be made of to define constants: names, unpacked or not.
_NAME_TARGETS = (ast.Name, ast.Tuple, ast.List, ast.Starred, ast.Load, ast.Store)


def _tables(text: str, future: bool) -> symtable.SymbolTable | None:
    try:
        return symtable.symtable((_FUTURE if future else "") + text, "<cell>", "exec")
    except (SyntaxError, ValueError):
        return None


def _top_level_binds(text: str) -> frozenset[str]:
    top = _tables(text, future=True)
    if top is None:
        return frozenset()
    return frozenset(
        s.get_name()
        for s in top.get_symbols()
        if (s.is_assigned() or s.is_imported()) and s.get_name() != "annotations"
    )


def _uses(text: str) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """``(now, later, annotations)``: the global names ``text`` reads when it runs, when its
    functions run, and only in annotations."""
    top = _tables(text, future=True)
    if top is None:
        return frozenset(), frozenset(), frozenset()
    now: set[str] = set()
    later: set[str] = set()

    def walk(table: symtable.SymbolTable, deferred: bool) -> None:
        into = later if deferred else now
        into.update(
            s.get_name() for s in table.get_symbols() if s.is_global() and s.is_referenced()
        )
        for child in table.get_children():
            walk(child, deferred or child.get_type() != "class")

    walk(top, False)
    every = _tables(text, future=False)
    annotated: set[str] = set()
    if every is not None:
        stack = [every]
        while stack:
            table = stack.pop()
            annotated.update(
                s.get_name() for s in table.get_symbols() if s.is_global() and s.is_referenced()
            )
            stack.extend(table.get_children())
    return frozenset(now), frozenset(later), frozenset(annotated - now - later)


# --------------------------------------------------------------------------------------
# Which statements an answer needs
# --------------------------------------------------------------------------------------


def needed(
    targets: Iterable[Statement],
    history: list[Statement],
    namespace: Mapping[str, Any],
    *,
    import_line: Callable[[str, Any], str | None] | None = None,
) -> Needs:
    """The statements of ``history`` (and import lines) that ``targets`` need, in order.

    Args:
        targets: the answers' definitions (each binds the name it is pinned to: a name of a
            target always means that target).
        history: every statement the kernel ran (and the saved file's), in order.
        namespace: the notebook's globals (the values of the names, for constants and imports).
        import_line: how to write a name that no carried statement binds (default: a module,
            an importable object or a literal; None where it cannot be written).

    Returns:
        The :class:`Needs`.
    """
    write = import_line or namespace_line
    targets = list(targets)
    pinned = {name: t for t in targets for name in t.binds}
    binders: dict[str, list[Statement]] = {}
    for statement in [*history, *targets]:
        for name in statement.binds:
            binders.setdefault(name, []).append(statement)
    finder = _Finder(pinned, binders, namespace)
    chosen: dict[int, Statement] = {}
    needs = Needs()
    todo = list(targets)
    while todo:
        statement = todo.pop()
        if statement.position in chosen:
            continue  # already carried (a recursive function, a helper two answers share)
        chosen[statement.position] = statement
        wanted = [(n, True) for n in statement.now] + [(n, False) for n in statement.later]
        wanted += [(n, None) for n in statement.annotations]
        for name, now in sorted(wanted, key=lambda w: w[0]):
            found = finder.binding(name, statement.position, bool(now))
            done = name in pinned or name in needs.missing or _written(name, needs.lines)
            if found is not None and finder.carryable(found):
                todo.append(found)
            elif done or (found is None and hasattr(builtins, name)):
                continue
            elif (line := write(name, namespace.get(name, _ABSENT))) is not None:
                needs.lines.append(line)
            elif now is not None:
                needs.missing[name] = _why(name, found, namespace)
    needs.statements = _one_binding_each([chosen[p] for p in sorted(chosen)])
    return needs


_ABSENT = object()


def _written(name: str, lines: list[str]) -> bool:
    return any(re.search(rf"\b{re.escape(name)}\b\s*(=|$)", line) for line in lines)


def _one_binding_each(chosen: list[Statement]) -> list[Statement]:
    """Each text once, and a definition dropped where a later chosen one binds its name again."""
    out: list[Statement] = []
    seen: set[str] = set()
    for i, statement in enumerate(chosen):
        if statement.source in seen:
            continue
        later = [s for s in chosen[i + 1 :] if s.kind == "definition"]
        if statement.kind == "definition" and any(statement.binds & s.binds for s in later):
            continue
        seen.add(statement.source)
        out.append(statement)
    return out


class _Finder:
    """Which statement binds a name, and whether it can be carried (memoised)."""

    def __init__(
        self,
        pinned: dict[str, Statement],
        binders: dict[str, list[Statement]],
        namespace: Mapping[str, Any],
    ) -> None:
        self.pinned, self.binders, self.namespace = pinned, binders, namespace
        self.known: dict[int, bool] = {}

    def binding(self, name: str, position: int, now: bool) -> Statement | None:
        """The statement whose binding of ``name`` a statement at ``position`` reads: the last
        before it when it reads it as it runs, else the last of all (the value live now)."""
        if name in self.pinned:
            return self.pinned[name]
        found = [s for s in self.binders.get(name, []) if s.position != position]
        before = [s for s in found if s.position < position]
        pool = before if now and before else found
        return max(pool, key=lambda s: s.position) if pool else None

    def carryable(self, statement: Statement) -> bool:
        if statement.kind in ("import", "definition"):
            return True
        if statement.kind != "assignment":
            return False
        if statement.position in self.known:
            return self.known[statement.position]
        self.known[statement.position] = False  # a cycle carries nothing
        ok = statement.trusted or all(
            is_constant(self.namespace.get(n, _ABSENT)) for n in statement.binds
        )
        for name in statement.now | statement.later:
            if not ok:
                break
            found = self.binding(name, statement.position, True)
            written = namespace_line(name, self.namespace.get(name, _ABSENT)) is not None
            if found is not None:
                ok = self.carryable(found) or written
            else:
                ok = hasattr(builtins, name) or written
        self.known[statement.position] = ok
        return ok


def _why(name: str, found: Statement | None, namespace: Mapping[str, Any]) -> str:
    if found is not None:
        first = found.source.strip().splitlines()[0][:60]
        return f"made at run time by `{first}`"
    if name in namespace:
        return f"a {type(namespace[name]).__name__} made at run time"
    return "not defined in any cell"


def is_constant(value: Any, depth: int = 0) -> bool:
    """A value a saved file may rebuild by running its assignment again: numbers, strings,
    patterns, dtypes, devices, tensors without a graph, and containers of them."""
    if value is None or isinstance(value, bool | int | float | complex | str | bytes | range):
        return True
    if isinstance(value, re.Pattern | enum.Enum):
        return True
    if depth > 4:
        return False
    if isinstance(value, tuple | list | set | frozenset):
        return len(value) <= 100_000 and all(is_constant(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return len(value) <= 100_000 and all(
            is_constant(k, depth + 1) and is_constant(v, depth + 1) for k, v in value.items()
        )
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(value, torch.dtype | torch.device):
            return True
        if isinstance(value, torch.Tensor):
            return value.grad_fn is None and not value.requires_grad and value.numel() <= 10**6
    return False


def namespace_line(name: str, value: Any) -> str | None:
    """An import (or a literal assignment) that binds ``name`` to ``value``, or None."""
    if value is _ABSENT:
        return None
    if isinstance(value, type(sys)):
        full = value.__name__
        return f"import {full}" if full == name else f"import {full} as {name}"
    module = getattr(value, "__module__", None)
    if (
        isinstance(module, str)
        and module not in ("__main__", "builtins")
        and (getattr(value, "__name__", None) == name)
    ):
        try:
            home = importlib.import_module(module)
        except ImportError:
            home = None
        if home is not None and getattr(home, name, None) is value:
            return f"from {module} import {name}"
    if isinstance(value, bool | int | float | str | bytes | tuple | type(None)):
        text = repr(value)
        try:
            if ast.literal_eval(text) == value:
                return f"{name} = {text}"
        except (ValueError, SyntaxError, RecursionError):
            pass
    return None
