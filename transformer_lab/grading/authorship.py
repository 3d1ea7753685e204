"""Whether the student wrote it: decided on the grader's side, from the notebook's source.

A lab asks for the student's own softmax, layer norm or attention (each part's bans in its spec,
:mod:`transformer_lab.checks.spec`). The kernel refuses a banned call while a check runs, but the
kernel is the student's: its hooks can be switched off, a thread or TorchScript runs outside
them, and the kit's ``exempt`` is importable there. So the verdict is taken here, where none of
the student's code runs, from the cells as the kernel ran them (after IPython's own input
transformations: a magic cannot hide a cell):

* :func:`refused_parts`: a part whose code reaches a banned operation or function under any
  spelling (``torch.special.softmax``, ``F.softmax``, ``x.softmax``, ``nn.Softmax``,
  ``getattr(torch, "softmax")``, an alias bound in another cell) earns none of its test cells'
  points. What a part reaches is every name its definition reads, followed through the
  notebook's top-level bindings (and through every statement that changes what such a name
  holds), not only what a check happened to call.
* the cells as Python (:func:`python_cells`) and their imports, for both this decision and the
  flags of :mod:`transformer_lab.grading.unreadable` (what cannot be resolved statically is a
  flag for review there, never a pass).

Reference: IPython's ``TransformerManager.transform_cell`` (the kernel's own input
transformations); Python's :mod:`ast`.
"""

from __future__ import annotations

import ast
import importlib
import re
import types
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from nbformat import NotebookNode

from transformer_lab.checks.spec import LabSpec, parts_of
from transformer_lab.pysource import parse_python

__all__ = [
    "MAGIC_CALLS",
    "SHELL_CALLS",
    "Cell",
    "canonical",
    "dotted_name",
    "import_aliases",
    "imported_names",
    "python_cells",
    "refused_parts",
    "resolved_name",
    "transformed",
]

#: Line and cell magics whose argument is Python the kernel runs: it is analysed as written.
_CODE_MAGICS = frozenset({"time", "timeit", "prun", "capture"})
#: Magics that run nothing of the student's Python (shell, plotting, the working directory).
_PLAIN_MAGICS = frozenset(
    {"matplotlib", "pwd", "ls", "cd", "pip", "conda", "who", "whos", "env", "config",
     "load_ext", "autoreload", "reload_ext", "system", "sx", "bash", "sh", "html",
     "HTML", "markdown", "latex", "javascript", "svg"}
)  # fmt: skip
#: The magic calls IPython's transformations write, and the shell calls that run no Python.
MAGIC_CALLS = frozenset({"run_line_magic", "run_cell_magic"})
SHELL_CALLS = frozenset({"system", "getoutput"})


@dataclass
class Cell:
    """One code cell as Python: its number in the notebook, its tree, whether the student wrote
    it (an answer cell or one without grading metadata) and what could not be read."""

    index: int
    tree: ast.Module
    student: bool
    flags: list[str] = field(default_factory=list)


def _meta(cell: NotebookNode) -> dict:
    meta = cell.get("metadata", {}).get("nbgrader")
    return meta if isinstance(meta, dict) else {}


def transformed(source: str) -> str:
    """The cell as IPython's kernel runs it (magics and ``!`` lines as calls)."""
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager().transform_cell(source)


def _magic_calls(tree: ast.AST) -> Iterator[tuple[ast.Call, str, list[str]]]:
    """``get_ipython().run_line_magic(name, arg)`` calls: (node, magic name, string args)."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MAGIC_CALLS
        ):
            args = [a.value if isinstance(a, ast.Constant) else None for a in node.args]
            name = args[0] if args and isinstance(args[0], str) else ""
            yield node, name, [a for a in args[1:] if isinstance(a, str)]


def _read_cell(index: int, source: str, student: bool) -> Cell:
    """A cell's tree, with the Python that code-running magics carry parsed in as well."""
    where = f"cell {index}"
    try:
        tree = parse_python(transformed(source))
    except (SyntaxError, ValueError) as exc:
        empty = ast.Module(body=[], type_ignores=[])
        return Cell(index, empty, student, [f"{where}: is not Python the grader can read ({exc})"])
    cell = Cell(index, tree, student)
    for node, name, texts in list(_magic_calls(tree)):
        line = f"{where} line {node.lineno}"
        if name in _CODE_MAGICS:
            for text in texts:
                code = _magic_code(text)
                if code is None:
                    cell.flags.append(f"{line}: runs code through %{name} the grader cannot read")
                else:
                    tree.body.extend(code.body)
        elif name not in _PLAIN_MAGICS:
            cell.flags.append(f"{line}: runs the magic %{name}, which the grader cannot read")
    return cell


def _magic_code(text: str) -> ast.Module | None:
    """The Python a code-running magic's argument holds (after its options: ``-n1 f(x)``)."""
    words = text.split(" ")
    for start in range(len(words)):
        try:
            return parse_python(transformed(" ".join(words[start:])))
        except (SyntaxError, ValueError):
            continue
    return None if text.strip() else ast.Module(body=[], type_ignores=[])


def python_cells(nb: NotebookNode) -> list[Cell]:
    """Every code cell but the test cells, as the kernel runs it."""
    cells = []
    for index, cell in enumerate(nb.cells, start=1):
        meta = _meta(cell)
        if cell.cell_type != "code" or (meta.get("grade") and not meta.get("solution")):
            continue
        student = bool(meta.get("solution")) or not meta
        cells.append(_read_cell(index, cell.source, student))
    return cells


def dotted_name(node: ast.AST) -> str:
    """``torch.nn.functional.softmax`` for an attribute chain on a name, else ``""``."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return ""


def imported_names(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The dotted names an import statement reaches (a module, or a name from one)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    module = "." * node.level + (node.module or "")
    return [module, *(f"{module}.{a.name}" for a in node.names)]


def import_aliases(trees: Iterable[ast.AST]) -> dict[str, str]:
    """Name -> the dotted module path or object an import binds it to (the whole notebook)."""
    found: dict[str, str] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        found[a.asname] = a.name
                    else:
                        root = a.name.split(".")[0]
                        found[root] = root
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    found[a.asname or a.name] = f"{node.module}.{a.name}"
    return found


def resolved_name(dotted: str, aliases: dict[str, str]) -> str:
    """``F.softmax`` -> ``torch.nn.functional.softmax`` through the notebook's imports."""
    root, _, rest = dotted.partition(".")
    if root not in aliases:
        return ""
    return f"{aliases[root]}.{rest}" if rest else aliases[root]


# --------------------------------------------------------------------------------------
# What a part reaches: refusals
# --------------------------------------------------------------------------------------


def canonical(name: str) -> str:
    """A name as the family of operations it belongs to: ``LogSoftmax`` and ``log_softmax`` as
    one, ``CrossEntropyLoss`` as ``cross_entropy``, ``BatchNorm1d`` as ``batch_norm``."""
    flat = name.lower().replace("_", "")
    flat = re.sub(r"[123]d$", "", flat)
    return flat.removesuffix("loss") if len(flat) > 4 else flat


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _own_level(nodes: Iterable[ast.AST]) -> Iterator[ast.AST]:
    """Every node of ``nodes``, not entering the bodies of the functions defined in them."""
    stack = list(nodes)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, _SCOPES):
            args = node.args
            stack += [*args.defaults, *(d for d in args.kw_defaults if d is not None)]
            stack += getattr(node, "decorator_list", [])
            continue
        if isinstance(node, ast.ClassDef):  # its body binds the class's names, not ours
            stack += [*node.bases, *node.keywords, *node.decorator_list]
            continue
        stack += list(ast.iter_child_nodes(node))


def _stored(nodes: Iterable[ast.AST]) -> set[str]:
    """Names bound at the level of ``nodes`` (assignments, loops, imports, defs)."""
    names: set[str] = set()
    for node in _own_level(nodes):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            names.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def _free(node: ast.AST) -> set[str]:
    """The names ``node`` reads from the scope around it (Python's scoping, simplified: a
    function's parameters and what it binds are its own, unless it declares them global)."""
    if isinstance(node, ast.Name):
        return {node.id} if isinstance(node.ctx, ast.Load) else set()
    if isinstance(node, _SCOPES):
        args = node.args
        every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
        params = {a.arg for a in every if a is not None}
        outside = [*args.defaults, *(d for d in args.kw_defaults if d is not None)]
        outside += getattr(node, "decorator_list", [])
        body = node.body if isinstance(node.body, list) else [node.body]
        declared = {n for b in _own_level(body) if isinstance(b, ast.Global) for n in b.names}
        local = (params | _stored(body)) - declared
        inner = set().union(*(_free(b) for b in body)) - local
        return set().union(*(_free(o) for o in outside)) | inner
    if isinstance(node, _COMPREHENSIONS):
        targets = {
            n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)
        }
        found = set().union(*(_free(c) for c in ast.iter_child_nodes(node)))
        return found - targets
    return set().union(*(_free(c) for c in ast.iter_child_nodes(node)))


def _bound(statement: ast.stmt, modules: set[str]) -> set[str]:
    """Names a top-level statement binds or changes (``x = ``, ``x[k] = ``, ``x.a = ``,
    ``x.append(...)``, ``def x``, ``import x``, ``global x`` inside a function it defines);
    a call of a module's function (``torch.manual_seed``) does not change the module's name."""
    return _stored([statement]) | (_changed(statement) - modules)


def _changed(node: ast.AST) -> set[str]:
    """Names of the scope around ``node`` whose objects it may change in place, or that a
    function of it rebinds (``global``)."""
    if isinstance(node, _SCOPES):
        body = node.body if isinstance(node.body, list) else [node.body]
        args = node.args
        every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
        declared = {n for b in _own_level(body) if isinstance(b, ast.Global) for n in b.names}
        local = ({a.arg for a in every if a is not None} | _stored(body)) - declared
        return (set().union(*(_changed(b) for b in body)) - local) | declared
    found: set[str] = set()
    if isinstance(node, ast.Attribute | ast.Subscript) and isinstance(
        node.ctx, ast.Store | ast.Del
    ):
        found |= _root_names(node.value)
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        found |= _root_names(node.func.value)  # x.append(...): may change x
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("setattr", "delattr")
        and node.args
    ):
        found |= _root_names(node.args[0])
    return found.union(*(_changed(c) for c in ast.iter_child_nodes(node)))


def _root_names(node: ast.AST) -> set[str]:
    """``x`` of ``x.a[0].b`` (the object that a change through them changes)."""
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return {node.id} if isinstance(node, ast.Name) else set()


def _reached(cells: list[Cell], start: str, modules: set[str]) -> list[ast.stmt]:
    """The top-level statements of the notebook that what ``start`` names depends on."""
    statements = [s for c in cells for s in c.tree.body]
    binds = [_bound(s, modules) for s in statements]
    wanted, seen, reached = {start}, set(), []
    while wanted - seen:
        name = (wanted - seen).pop()
        seen.add(name)
        for statement, names in zip(statements, binds, strict=True):
            if name in names and statement not in reached:
                reached.append(statement)
                wanted |= _free(statement)
    return reached


@dataclass(frozen=True)
class _BanTargets:
    """One part's bans, as the names and objects a reference is compared with."""

    ops: frozenset[str]  # canonical names of the refused torch operations
    names: frozenset[str]  # canonical last names of the refused functions and classes
    objects: tuple[Any, ...]  # the refused objects themselves
    modules: tuple[str, ...]  # refused modules (every name defined in them)
    reason: str


def _ban_targets(spec: LabSpec, part: str) -> _BanTargets | None:
    from transformer_lab.judge.bans import OP_FAMILIES, _resolve

    bans = [spec.bans[b] for b in spec.parts[part].bans if b in spec.bans]
    if not bans:
        return None
    ops: set[str] = set()
    names: set[str] = set()
    objects: list[Any] = []
    modules: list[str] = []
    for ban in bans:
        for op in ban.ops:
            ops |= {canonical(n) for n in OP_FAMILIES.get(op, frozenset({op}))}
        for dotted in ban.functions:
            try:
                obj = _resolve(dotted)
            except (ImportError, AttributeError):
                continue
            if isinstance(obj, types.ModuleType):
                modules.append(obj.__name__)
            else:
                objects.append(obj)
                names.add(canonical(dotted.rpartition(".")[2]))
    reason = next((b.reason for b in bans if b.reason), "")
    return _BanTargets(frozenset(ops), frozenset(names), tuple(objects), tuple(modules), reason)


def _object(dotted: str) -> Any:
    """The object a dotted name of torch or the kit refers to, or None (nothing else is
    imported here: the grader never imports a module the student named)."""
    if not dotted.startswith(("torch.", "transformer_lab.")) and dotted != "torch":
        return None
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except Exception:  # not a module: an attribute of a shorter one
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr, None)
            if obj is None:
                return None
        return obj
    return None


def _refused(dotted: str, targets: _BanTargets) -> bool:
    """Whether ``dotted`` (a name resolved through the notebook's imports, or a bare attribute
    or string) is something ``targets`` refuses: a resolved name by what it is, a bare one by
    its name."""
    if dotted in targets.modules or dotted.startswith(tuple(f"{m}." for m in targets.modules)):
        return True
    parts = dotted.split(".")
    if len(parts) > 2 and _refused(".".join(parts[:-1]), targets):
        return True  # torch.softmax.__call__, F.softmax.__wrapped__
    last = canonical(dotted.rpartition(".")[2])
    obj = _object(dotted)
    if obj is None:
        return last in targets.ops or (last in targets.names and "." not in dotted)
    if any(obj is target for target in targets.objects):
        return True
    module = getattr(obj, "__module__", None) or ""
    if any(module == m or module.startswith(f"{m}.") for m in targets.modules):
        return True
    name = getattr(obj, "__name__", None)
    own = canonical(name) if isinstance(name, str) else last
    return dotted.startswith("torch") and (own in targets.ops or last in targets.ops)


def _not_annotations(statement: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``statement``, leaving out annotations and the classes of an
    ``isinstance`` test (a type named is not a call made)."""
    stack = [statement]
    while stack:
        node = stack.pop()
        yield node
        skip: list[ast.AST] = []
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            skip.append(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns:
            skip.append(node.returns)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("isinstance", "issubclass")
            and len(node.args) == 2
        ):
            skip.append(node.args[1])
        stack += [c for c in ast.iter_child_nodes(node) if c not in skip]


def _references(
    statement: ast.stmt, aliases: dict[str, str], methods: set[str], bound: set[str]
) -> Iterator[str]:
    """What a statement refers to, as resolved dotted names or bare names (``x.softmax`` ->
    ``softmax``; ``F.softmax`` -> ``torch.nn.functional.softmax``; strings as written; a name
    the notebook never binds, as from ``from torch import *``)."""
    yield from sorted(_free(statement) - bound - set(aliases))
    for node in _not_annotations(statement):
        if isinstance(node, ast.Attribute):
            dotted = resolved_name(dotted_name(node), aliases)
            if dotted:
                yield dotted
            elif node.attr not in methods:  # a method of the student's own is theirs
                yield node.attr
        elif isinstance(node, ast.Name) and node.id in aliases:
            yield aliases[node.id]
        elif isinstance(node, ast.Import | ast.ImportFrom):
            yield from imported_names(node)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if len(text) < 200 and all(p.isidentifier() for p in text.split(".")):
                yield text


def _own_names(cells: list[Cell]) -> set[str]:
    """The methods the notebook's classes define."""
    defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {
        m.name
        for c in cells
        for n in ast.walk(c.tree)
        if isinstance(n, ast.ClassDef)
        for m in n.body
        if isinstance(m, defs)
    }


def refused_parts(submission: NotebookNode, spec: LabSpec, source: NotebookNode) -> dict[str, str]:
    """Test cell -> the refusal's message, for every test cell of a part whose code reaches
    something its bans refuse (``source``: the lab's notebook with tests, for the parts'
    cells)."""
    from transformer_lab.judge.bans import refusal

    cells = python_cells(submission)
    aliases = import_aliases(c.tree for c in cells)
    modules = set(aliases)  # a name an import binds: its meaning is the import's
    methods = _own_names(cells)
    bound = {name for c in cells for s in c.tree.body for name in _bound(s, set())}
    hidden = {
        _meta(c).get("grade_id")
        for c in source.cells
        if c.cell_type == "code" and "BEGIN HIDDEN TESTS" in c.source
    }
    refused: dict[str, str] = {}
    for part, test_cells in parts_of(source).items():
        targets = _ban_targets(spec, part) if part in spec.parts else None
        if targets is None:
            continue
        found = next(
            (
                dotted
                for statement in _reached(cells, part, modules)
                for dotted in _references(statement, aliases, methods, bound)
                if _refused(dotted, targets)
            ),
            None,
        )
        if found is None:
            continue
        for cell in test_cells:
            # A hidden cell names nothing the student wrote (the found name is theirs).
            what = "something" if cell in hidden else f"`{found}`"
            message = refusal(what, targets.reason)
            refused[cell] = f"The grader read your code: {message[0].lower()}{message[1:]}"
    return refused
