"""The package's import graph, read from the source: no circle, and no arrow that runs back up.

Every ``import`` and ``from ... import`` of ``transformer_lab`` (those inside functions too: a
deferred import is still a dependency) and every ``importlib.import_module("...")`` of a literal
name is an arrow between two of its modules. The layers, lowest first; a module may import its
own layer and the layers below it, never one above:

1. **foundation**: the package itself, ``_lazy``, ``pysource``, ``graded`` (the ``@graded``
   marks and the locked answer's error), ``profiles``, ``standins`` (PyTorch's stand-ins for
   graded parts: built from PyTorch alone, read by the kernel's bans and the judge);
2. **protocol**: ``judge/``, the kernel's side of the judge (the wire format, mirrored modules,
   the bans a check forwards and the kernel enforces, the log of torch operations);
3. **kit**: the kit's components, data, training and figures;
4. **checks**: ``checks/``, the visible checks and each lab's spec;
5. **carry**: ``answers`` and ``lab``, which fill locked answers with the student's own and run
   the checks in the notebook;
6. **grading**: ``grading/``, the instructor's side (judge, sandbox, hidden checks, LMS);
7. **commands**: ``cli``.

``docs/architecture.md`` states the same layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "transformer_lab"

#: Module prefix -> layer (the longest matching prefix decides).
LAYERS: dict[str, int] = {
    "transformer_lab": 1,
    "transformer_lab._lazy": 1,
    "transformer_lab.pysource": 1,
    "transformer_lab.graded": 1,
    "transformer_lab.profiles": 1,
    "transformer_lab.standins": 1,
    "transformer_lab.judge": 2,
    **{
        f"transformer_lab.{name}": 3
        for name in (
            "attention", "blocks", "masks", "positional", "models", "generation", "gpt2",
            "scale", "seq2seq", "tokenizers", "data", "training", "figures",
            "diagrams", "plots",
        )
    },
    "transformer_lab.checks": 4,
    "transformer_lab.answers": 5,
    "transformer_lab.lab": 5,
    "transformer_lab.grading": 6,
    "transformer_lab.cli": 7,
}  # fmt: skip
LAYER_NAMES = {1: "foundation", 2: "protocol", 3: "kit", 4: "checks", 5: "carry", 6: "grading"}
LAYER_NAMES[7] = "commands"


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> its file, for every module of the package under ``root``."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _target(name: str, known: dict[str, Path]) -> str | None:
    """The package's module that importing ``name`` runs (its longest known prefix)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _imported(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every dotted name the module ``module`` imports (``from a import b`` gives ``a.b``)."""
    names: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.add(node.args[0].value)
    return names


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (itself left out)."""
    known = modules(root)
    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        imported = _imported(tree, module, path.name == "__init__.py")
        targets = {t for t in (_target(n, known) for n in imported) if t}
        # ``from transformer_lab.judge import wire`` imports judge/__init__ and judge.wire: the
        # package itself is an arrow only where nothing below it was named.
        kept = {t for t in targets if not any(o.startswith(f"{t}.") for o in targets - {t})}
        graph[module] = kept - {module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each as a path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def layer(module: str) -> int:
    """The layer of ``module`` (its longest prefix in :data:`LAYERS`)."""
    name = module
    while name not in LAYERS:
        if "." not in name:
            raise KeyError(f"{module} is in no layer of tests/test_import_graph.py: add it")
        name = name.rpartition(".")[0]
    return LAYERS[name]


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Every arrow from a module to a module of a higher layer, as a readable line."""
    return [
        f"{a} ({LAYER_NAMES[layer(a)]}) -> {b} ({LAYER_NAMES[layer(b)]})"
        for a in sorted(graph)
        for b in sorted(graph[a])
        if layer(b) > layer(a)
    ]


def test_the_package_has_no_import_circle() -> None:
    found = cycles(import_graph())
    assert not found, "import circles (each group imports itself round): " + "; ".join(
        " <-> ".join(group) for group in found
    )


def test_no_import_runs_back_up_the_layers() -> None:
    graph = import_graph()
    assert "transformer_lab.judge.kernel" in graph and "transformer_lab.graded" in graph
    assert not upward(graph), "imports that run back up the layers:\n" + "\n".join(upward(graph))


def test_every_module_has_a_layer() -> None:
    for module in import_graph():
        layer(module)  # raises, naming the module


def test_the_graph_sees_deferred_imports_circles_and_upward_arrows(tmp_path: Path) -> None:
    """The test can fail: a circle through a function-level import and an arrow from the
    foundation up to the carry layer, in a made-up package, are both found and named."""
    root = tmp_path / "transformer_lab"
    (root / "judge").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "judge" / "__init__.py").write_text("")
    (root / "graded.py").write_text("def f():\n    from transformer_lab.answers import ANSWERS\n")
    (root / "answers.py").write_text("from . import masks\n")
    (root / "masks.py").write_text("from transformer_lab.graded import f\n")
    (root / "judge" / "kernel.py").write_text(
        "import importlib\nimportlib.import_module('transformer_lab.checks.lab01')\n"
    )
    (root / "checks").mkdir()
    (root / "checks" / "__init__.py").write_text("")
    (root / "checks" / "lab01.py").write_text("")
    graph = import_graph(root)
    assert cycles(graph) == [
        ["transformer_lab.answers", "transformer_lab.graded", "transformer_lab.masks"]
    ]
    assert upward(graph) == [
        "transformer_lab.graded (foundation) -> transformer_lab.answers (carry)",
        "transformer_lab.judge.kernel (protocol) -> transformer_lab.checks.lab01 (checks)",
    ]


def test_a_locked_answers_line_still_says_how_to_get_it() -> None:
    """``graded`` no longer imports ``answers``; the advice reaches its line through
    ``graded.HOW_TO_GET``, which importing ``answers`` fills."""
    import transformer_lab.answers  # noqa: F401  (what every command and notebook imports)
    from transformer_lab.graded import locked_line

    asked = locked_line(
        "fit", "transformer_lab.masks.causal_mask is the answer to lab 05_masking, x"
    )
    assert asked.startswith("fit: needs transformer_lab.masks.causal_mask, the answer to lab 05")
    assert "pass its visible check in that lab's notebook (your answer is saved to" in asked
    kit_only = locked_line(
        "fit", "transformer_lab.training.modules.log_metrics is the answer to lab 04_x, y"
    )
    assert kit_only.endswith("holds once that lab's deadline has passed: reinstall then.")
