"""Each lab's spec: its graded parts, what each builds on, and what each typical mistake costs.

One TOML file per lab (``transformer_lab/checks/specs/<lab>.toml``) declares, for every graded
function or class of the lab (an exercise of its notebook, in the notebook's order):

* ``kit``: the kit's own implementations that answer it (``@graded`` for this lab: locked in
  the student package until the lab's deadline);
* ``builds_on``: the earlier parts it calls by name, each with its PyTorch stand-in in
  :mod:`transformer_lab.standins`. When a part fails its own test cells, the judge judges the
  later part on the stand-in (issue 24: one mistake costs only its own points);
* ``mistakes``: the kit's catalogue of typical mistakes of that part (``tests/``), each with
  the test cells it costs: a list of cells, or a record (:class:`Mistake`) that also holds the
  hint the checks give, the wrong code the tests run or the oracle's options that give its
  wrong output, so that they read it from here. A
  mistake may cost only cells of its own part: that is the rule the spec states and
  ``tests/test_mistake_costs.py`` holds through the judge;
* ``bans``: the names of the lab's ``[bans.<name>]`` tables that hold while a check runs it;
* ``points``: what the exercise is worth (its heading's points, the sum of its test cells');
* ``signature``: the call as the curriculum writes it (``"name(a, b, c=1, *, d=None)"``; a
  class: its constructor's), and ``methods``,
  a class's methods the same way (``["forward(x, kv_cache=None)"]``); the lint holds the
  solution cell's ``def``/``class`` to them; ``attributes``: the layers of a class that the
  checks read, each its name and what it holds (``"norm1 (after self-attention)"``): the
  solution must set them, and a check that cannot load a layer's weights lists them;
* ``check``: the visible check a passing answer is saved on (:data:`transformer_lab.answers.ANSWERS`
  derives its table from these keys), ``check_<snake_case name>`` unless given; ``saved =
  false`` for a part later labs never use (nothing saved); ``pieces``: the kit's answers the lab
  grades through this part only (``{"transformer_lab.training.modules.log_metrics" =
  "check_training_step"}``: no notebook defines them, a stand-in fills them); ``replaces``:
  the kit answer a saved answer replaces, where the kit names it otherwise than the part.

A lab's ``[bans.<name>]`` tables say what its graded code may not call (torch operation
families ``ops``, dotted ``functions``, the ``reason`` the refusal gives); the checks build their
:class:`~transformer_lab.judge.bans.Ban` from them (:meth:`LabSpec.ban`), and the lint holds
that every part's kit answer is refused by its own bans. Its ``[tolerance]`` table names the
tolerances that its visible and hidden checks use (``float32 = 1e-4``, or an ``atol``/``rtol``
pair ``long_angles = {atol = 2e-4, rtol = 1e-3}``).

The notebook stays the home of cells and each cell's points (nbgrader reads them there); the
spec names cells and each part's total, and :func:`parts_of` reads the notebook to tell which
cells belong to which part; :func:`lint_spec` names every disagreement.
The judge (:func:`~transformer_lab.grading.judge.stand_ins_for`), the visible and hidden checks
(bans, tolerances), the lab standard's test, ``labs check``, the catalogue's tests and the
curriculum's table of graded parts (:func:`costs_table`) read it.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from transformer_lab.pysource import parse_python

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (the kit's checks read the spec on a student's machine)
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = [
    "EXERCISE_HEADING",
    "BanSpec",
    "LabSpec",
    "Mistake",
    "Part",
    "SpecError",
    "all_specs",
    "costs_table",
    "lint_curriculum",
    "lint_readme",
    "lint_spec",
    "load",
    "parse",
    "parts_of",
]

#: An exercise's heading in a lab notebook: its number, points and the name the student defines
#: (the lab standard, :mod:`transformer_lab.grading.standard`, reads the same headings).
EXERCISE_HEADING = re.compile(
    r"^### Exercise (\d+) \((\d+) points?\): `([A-Za-z_][A-Za-z0-9_]*)`", re.M
)


class SpecError(ValueError):
    """A spec file that does not say what this module reads."""


@dataclass(frozen=True)
class Part:
    """One graded function or class of a lab.

    Attributes:
        name: the notebook name the student defines.
        kit: the kit's implementations of it (dotted names).
        builds_on: earlier part -> its stand-in's name in :mod:`transformer_lab.standins`.
        mistakes: catalogued mistake (its id in ``tests/mistake_catalogue.py`` without the
            ``labNN`` prefix) -> the test cells it costs.
        records: the mistakes declared as a record (a table, not a list of cells): id -> its
            :class:`Mistake`, whose hint the checks give and whose wrong code the tests run.
        bans: the lab's bans (names of its ``[bans.<name>]`` tables) that hold while a check
            runs this part.
        points: what the exercise is worth (None: not declared, which the lint names).
        signature: the call as the curriculum writes it (a class: its constructor's).
        methods: a class's methods' signatures (``"forward(x, kv_cache=None)"``).
        attributes: a class's layers the checks read, each its name and then what it holds
            (``"norm1 (after self-attention)"``): the solution assigns ``self.<name>``, and a
            check that cannot load its weights lists them (:attr:`layout`).
        check: the visible check a passing answer is saved on (``check_...``).
        saved: whether a passing answer is saved for later labs.
        pieces: kit answer (dotted) -> the visible check that grades it through this part.
        replaces: the kit answer a saved answer replaces, where its name is not the part's.
    """

    name: str
    kit: tuple[str, ...] = ()
    builds_on: dict[str, str] = field(default_factory=dict)
    mistakes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    bans: tuple[str, ...] = ()
    records: dict[str, Mistake] = field(default_factory=dict)
    points: int | None = None
    signature: str = ""
    methods: tuple[str, ...] = ()
    attributes: tuple[str, ...] = ()
    check: str = ""
    saved: bool = True
    pieces: dict[str, str] = field(default_factory=dict)
    replaces: str = ""

    @property
    def attribute_names(self) -> tuple[str, ...]:
        """The names of :attr:`attributes` (``"norm1 (after ...)"`` -> ``"norm1"``)."""
        return tuple(attribute.split()[0] for attribute in self.attributes)

    @property
    def layout(self) -> str:
        """The layers the checks read, as a message lists them (``self.self_attn (...), ...``)."""
        return ", ".join(f"self.{attribute}" for attribute in self.attributes)

    def options_for(self, oracle: Callable[..., Any]) -> list[tuple[str, dict[str, Any]]]:
        """(hint, options) of each record whose options are keyword options of ``oracle``, in
        the spec's order (a part judged by several oracles holds the records of each)."""
        keys = set(inspect.signature(oracle).parameters)
        records = self.records.values()
        return [(r.hint, r.options) for r in records if r.options and r.options.keys() <= keys]

    @property
    def kit_answer(self) -> str | None:
        """The kit's object with the part's own name and interface (None where there is none:
        a class the student writes from scratch, or one the kit answers method by method):
        ``replaces``, else the kit answer named like the part."""
        named = (k for k in self.kit if k.rpartition(".")[2] == self.name)
        return self.replaces or next(named, None)


@dataclass(frozen=True)
class Mistake:
    """A named mistake declared once, as a record of its part's spec::

        [parts.causal_mask.mistakes."causal causal_upper"]
        cells = ["test_causal_mask", "test_causal_mask_hidden"]
        hint = "Your mask is upper-triangular: ..."
        wrong = '''def causal_upper(T): ...'''

    Attributes:
        id: its id (``"causal causal_upper"``: the catalogue's id without ``labNN``).
        cells: the test cells it costs.
        hint: what the checks say when an answer makes it (their key for it, the stored
            fixtures' too); empty where the checks word it otherwise.
        wrong: Python source defining the wrong answer (one function named after the id's last
            word), for the tests; empty where a test holds it.
        options: where the mistake's wrong output is the part's oracle run with other keyword
            options (``{tie = "max"}``), those options: the hidden checks build the output from
            them; empty where they word it otherwise.
    """

    id: str
    cells: tuple[str, ...]
    hint: str = ""
    wrong: str = ""
    options: dict[str, Any] = field(default_factory=dict)

    def wrong_answer(self) -> Any:
        """The function :attr:`wrong` defines (run with ``torch`` imported)."""
        import torch

        name = self.id.rpartition(" ")[2]
        namespace: dict[str, Any] = {"torch": torch}
        exec(compile(self.wrong, f"<mistake {self.id!r}>", "exec"), namespace)
        if not callable(namespace.get(name)):
            raise SpecError(f"the wrong code of mistake {self.id!r} defines no function {name}")
        return namespace[name]


@dataclass(frozen=True)
class BanSpec:
    """One ``[bans.<name>]`` table: what graded code may not call while a check runs it."""

    ops: tuple[str, ...] = ()
    functions: tuple[str, ...] = ()
    reason: str = ""

    def refuses(self, dotted: str) -> bool:
        """Whether the dotted name ``dotted`` falls under one of the banned ``functions``
        (itself, or a member of a banned module or class)."""
        return any(dotted == f or dotted.startswith(f + ".") for f in self.functions)


@dataclass(frozen=True)
class LabSpec:
    """A lab's spec: its parts in the notebook's order."""

    lab: str
    parts: dict[str, Part]
    bans: dict[str, BanSpec] = field(default_factory=dict)
    tolerance: dict[str, float | dict[str, float]] = field(default_factory=dict)

    def mistake(self, mistake_id: str) -> Mistake:
        """The mistake declared as a record under ``mistake_id`` (``"causal causal_upper"``)."""
        for part in self.parts.values():
            if mistake_id in part.records:
                return part.records[mistake_id]
        known = sorted(k for p in self.parts.values() for k in p.records)
        raise SpecError(f"the spec of {self.lab} has no mistake record {mistake_id!r} ({known})")

    def builds_on(self, name: str) -> dict[str, str]:
        """Earlier part -> stand-in, for the part ``name`` (nothing for an unknown name)."""
        part = self.parts.get(name)
        return dict(part.builds_on) if part else {}

    def ban(self, name: str) -> Any:
        """The :class:`~transformer_lab.judge.bans.Ban` of the table ``[bans.<name>]``."""
        from transformer_lab.judge.bans import Ban

        if name not in self.bans:
            raise SpecError(
                f"the spec of {self.lab} has no [bans.{name}] (it has {sorted(self.bans)})"
            )
        table = self.bans[name]
        return Ban(ops=table.ops, functions=table.functions, reason=table.reason)

    def tol(self, name: str) -> float:
        """The tolerance ``name`` of its ``[tolerance]`` table (a number)."""
        value = self._tolerance(name)
        if isinstance(value, dict):
            raise SpecError(f"tolerance.{name} of {self.lab} is an atol/rtol pair: use close_tol")
        return value

    def close_tol(self, name: str) -> dict[str, float]:
        """The ``{atol, rtol}`` pair ``name = {atol = ..., rtol = ...}`` of ``[tolerance]``,
        to pass as ``**spec.close_tol(name)``."""
        value = self._tolerance(name)
        if not isinstance(value, dict):
            raise SpecError(f"tolerance.{name} of {self.lab} is one number: use tol")
        return dict(value)

    def _tolerance(self, name: str) -> float | dict[str, float]:
        if name not in self.tolerance:
            known = sorted(self.tolerance)
            raise SpecError(f"the spec of {self.lab} has no tolerance {name!r} (it has {known})")
        return self.tolerance[name]


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SpecError(f"{where} must be a list of strings, not {value!r}")
    return tuple(value)


def snake_case(name: str) -> str:
    """``CausalSelfAttention`` -> ``causal_self_attention`` (a function's name is kept)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def signature_arguments(signature: str, where: str) -> tuple[str, ast.arguments]:
    """The name and arguments of a signature ``"name(a, b=1, *, c=None)"``; :class:`SpecError`
    naming ``where`` for text that is no such call."""
    try:
        tree = ast.parse(f"def {signature.strip()}:\n    pass\n")
    except SyntaxError:
        tree = None
    if tree is None or len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef):
        raise SpecError(f"{where} = {signature!r} is not a signature like 'name(a, b=1)'")
    node = tree.body[0]
    return node.name, node.args


def arguments_text(args: ast.arguments) -> str:
    """Arguments as written without annotations (``"x, dim=-1"``), to compare two signatures."""
    bare = ast.arguments(
        posonlyargs=[ast.arg(a.arg) for a in args.posonlyargs],
        args=[ast.arg(a.arg) for a in args.args],
        vararg=ast.arg(args.vararg.arg) if args.vararg else None,
        kwonlyargs=[ast.arg(a.arg) for a in args.kwonlyargs],
        kw_defaults=args.kw_defaults,
        kwarg=ast.arg(args.kwarg.arg) if args.kwarg else None,
        defaults=args.defaults,
    )
    return ast.unparse(bare)


def _signatures(name: str, body: dict[str, Any], where: str) -> tuple[str, tuple[str, ...]]:
    """The part's ``signature`` (named after the part) and ``methods``, validated."""
    signature = body.get("signature", "")
    if not isinstance(signature, str):
        raise SpecError(f"{where}: parts.{name}.signature must be a string, not {signature!r}")
    if signature:
        called, _ = signature_arguments(signature, f"{where}: parts.{name}.signature")
        if called != name:
            raise SpecError(
                f"{where}: parts.{name}.signature = {signature!r} calls {called!r}, not {name!r}"
            )
    methods = _strings(body.get("methods", []), f"{where}: parts.{name}.methods")
    for method in methods:
        signature_arguments(method, f"{where}: parts.{name}.methods")
    return signature, methods


def _carried(name: str, body: dict[str, Any], where: str) -> dict[str, Any]:
    """``points``, ``check``, ``saved``, ``pieces`` and ``replaces`` of a part, validated."""
    points = body.get("points")
    if points is not None and (isinstance(points, bool) or not isinstance(points, int)
                               or points <= 0):  # fmt: skip
        raise SpecError(f"{where}: parts.{name}.points must be a positive integer, not {points!r}")
    check = body.get("check", f"check_{snake_case(name)}")
    if not isinstance(check, str) or not re.fullmatch(r"check_\w+", check):
        raise SpecError(f"{where}: parts.{name}.check must name a check_... , not {check!r}")
    saved = body.get("saved", True)
    if not isinstance(saved, bool):
        raise SpecError(f"{where}: parts.{name}.saved must be true or false, not {saved!r}")
    pieces = body.get("pieces", {})
    if not isinstance(pieces, dict) or not all(
        isinstance(v, str) and v.startswith("check_") for v in pieces.values()
    ):
        raise SpecError(f"{where}: parts.{name}.pieces maps a kit answer to a check_..., not "
                        f"{pieces!r}")  # fmt: skip
    replaces = body.get("replaces", "")
    if not isinstance(replaces, str) or (replaces and replaces not in body.get("kit", [])):
        raise SpecError(f"{where}: parts.{name}.replaces must be one of its kit answers, not "
                        f"{replaces!r}")  # fmt: skip
    return {"points": points, "check": check, "saved": saved, "pieces": dict(pieces),
            "replaces": replaces}  # fmt: skip


PART_KEYS = frozenset(
    {"kit", "builds_on", "mistakes", "bans", "points", "signature", "methods", "attributes",
     "check", "saved", "pieces", "replaces"}
)  # fmt: skip


def _part(name: str, body: Any, where: str) -> Part:
    if not isinstance(body, dict):
        raise SpecError(f"{where}: [parts.{name}] must be a table")
    unknown = set(body) - PART_KEYS
    if unknown:
        raise SpecError(f"{where}: [parts.{name}] has unknown keys {sorted(unknown)}")
    signature, methods = _signatures(name, body, where)
    builds_on = body.get("builds_on", {})
    if not isinstance(builds_on, dict) or not all(isinstance(v, str) for v in builds_on.values()):
        raise SpecError(f"{where}: parts.{name}.builds_on maps a part to a stand-in's name")
    mistakes = body.get("mistakes", {})
    if not isinstance(mistakes, dict):
        raise SpecError(f"{where}: parts.{name}.mistakes must be a table")
    records = {
        key: _mistake(key, value, f"{where}: parts.{name}.mistakes.{key!r}")
        for key, value in mistakes.items()
        if isinstance(value, dict)
    }
    return Part(
        name=name,
        kit=_strings(body.get("kit", []), f"{where}: parts.{name}.kit"),
        builds_on=dict(builds_on),
        mistakes={
            key: records[key].cells
            if key in records
            else _strings(cells, f"{where}: parts.{name}.mistakes.{key!r}")
            for key, cells in mistakes.items()
        },
        bans=_strings(body.get("bans", []), f"{where}: parts.{name}.bans"),
        records=records,
        signature=signature,
        methods=methods,
        attributes=_strings(body.get("attributes", []), f"{where}: parts.{name}.attributes"),
        **_carried(name, body, where),
    )


def _mistake(key: str, body: dict[str, Any], where: str) -> Mistake:
    """A mistake's record: ``cells`` (required), ``hint`` and ``wrong`` (strings), ``options``
    (a table)."""
    unknown = set(body) - {"cells", "hint", "wrong", "options"}
    if unknown or "cells" not in body:
        raise SpecError(
            f"{where} holds cells and, if need be, hint, wrong and options; not {sorted(body)}"
        )
    for text in ("hint", "wrong"):
        if not isinstance(body.get(text, ""), str):
            raise SpecError(f"{where}.{text} must be a string, not {body[text]!r}")
    if not isinstance(body.get("options", {}), dict):
        raise SpecError(f"{where}.options must be a table, not {body['options']!r}")
    return Mistake(
        key,
        _strings(body["cells"], f"{where}.cells"),
        body.get("hint", ""),
        body.get("wrong", ""),
        dict(body.get("options", {})),
    )


def _ban(name: str, body: Any, where: str) -> BanSpec:
    if not isinstance(body, dict) or set(body) - {"ops", "functions", "reason"}:
        raise SpecError(f"{where}: [bans.{name}] holds only ops, functions and reason")
    reason = body.get("reason", "")
    if not isinstance(reason, str):
        raise SpecError(f"{where}: bans.{name}.reason must be a string, not {reason!r}")
    return BanSpec(
        ops=_strings(body.get("ops", []), f"{where}: bans.{name}.ops"),
        functions=_strings(body.get("functions", []), f"{where}: bans.{name}.functions"),
        reason=reason,
    )


def _positive(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and value > 0


def _tolerances(body: Any, where: str) -> dict[str, float | dict[str, float]]:
    """``name = number``, or ``name = {atol = number, rtol = number}``."""
    if not isinstance(body, dict):
        raise SpecError(f"{where}: [tolerance] must be a table of name = number")
    out: dict[str, float | dict[str, float]] = {}
    for key, value in body.items():
        if isinstance(value, dict):
            if set(value) != {"atol", "rtol"} or not all(map(_positive, value.values())):
                raise SpecError(
                    f"{where}: tolerance.{key} must be {{atol = number, rtol = number}} with "
                    f"positive numbers, not {value!r}"
                )
            out[key] = {k: float(v) for k, v in value.items()}
        elif _positive(value):
            out[key] = float(value)
        else:
            raise SpecError(f"{where}: tolerance.{key} must be a positive number, not {value!r}")
    return out


def parse(text: str, where: str = "<spec>") -> LabSpec:
    """A spec from its TOML text; :class:`SpecError` naming what is wrong."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{where} is not TOML: {exc}") from None
    if not isinstance(data.get("lab"), str) or not isinstance(data.get("parts"), dict):
        raise SpecError(f'{where} must set `lab = "NN_name"` and hold [parts.<name>] tables')
    unknown = set(data) - {"lab", "parts", "bans", "tolerance"}
    if unknown:
        raise SpecError(f"{where} has unknown tables or keys {sorted(unknown)}")
    parts = {name: _part(name, body, where) for name, body in data["parts"].items()}
    bans = data.get("bans", {})
    if not isinstance(bans, dict):
        raise SpecError(f"{where}: [bans] must hold [bans.<name>] tables")
    return LabSpec(
        lab=data["lab"],
        parts=parts,
        bans={name: _ban(name, body, where) for name, body in bans.items()},
        tolerance=_tolerances(data.get("tolerance", {}), where),
    )


@cache
def load(lab: str) -> LabSpec:
    """The spec of ``lab`` (``"03_multi_head_attention"``), read from the package."""
    number = lab[:2]
    if not re.fullmatch(r"\d\d", number):
        raise SpecError(f"no lab {lab!r}: a lab is named like '03_multi_head_attention'")
    path = resources.files("transformer_lab.checks") / "specs" / f"lab{number}.toml"
    if not path.is_file():
        raise SpecError(f"lab {lab!r} has no spec ({path})")
    spec = parse(path.read_text(encoding="utf-8"), str(path))
    if spec.lab != lab:
        raise SpecError(f"{path} is the spec of {spec.lab!r}, not of {lab!r}")
    return spec


@cache
def all_specs() -> tuple[LabSpec, ...]:
    """The spec of every lab the package holds, in the labs' order."""
    folder = resources.files("transformer_lab.checks") / "specs"
    names = sorted(p.name for p in folder.iterdir() if re.fullmatch(r"lab\d\d\.toml", p.name))
    return tuple(
        parse((folder / name).read_text(encoding="utf-8"), f"{folder}/{name}") for name in names
    )


def parts_of(nb: Any) -> dict[str, dict[str, int]]:
    """Part name -> {test cell: points} of a lab notebook (``nbformat`` node), in its order:
    each autograded test cell belongs to the exercise whose heading comes before it."""
    parts: dict[str, dict[str, int]] = {}
    current = None
    for cell in nb.cells:
        found = EXERCISE_HEADING.search(cell.source) if cell.cell_type == "markdown" else None
        if found:
            current = found.group(3)
            parts[current] = {}
        meta = cell.get("metadata", {}).get("nbgrader", {})
        graded_test = meta.get("grade") and not meta.get("solution")
        if current and cell.cell_type == "code" and graded_test:
            parts[current][meta["grade_id"]] = int(meta.get("points", 0))
    return parts


def lint_spec(lab_spec: LabSpec, nb: Any, lab: str) -> list[str]:
    """Every place the spec disagrees with its lab's source notebook (``nb``) or the kit."""
    import importlib

    from transformer_lab import standins
    from transformer_lab.graded import GRADED

    where = f"{lab}: spec"
    if lab_spec.lab != lab:
        return [f"{where} says lab = {lab_spec.lab!r}"]
    cells = parts_of(nb)
    problems = []
    if list(lab_spec.parts) != list(cells):
        problems.append(
            f"{where} lists the parts {list(lab_spec.parts)}; the notebook's exercises are "
            f"{list(cells)} (the same names, in the notebook's order)"
        )
    earlier: list[str] = []
    for part in lab_spec.parts.values():
        for base, stand_in in part.builds_on.items():
            if base not in earlier:
                problems.append(f"{where}: {part.name} builds on {base!r}, not an earlier part")
            if not callable(getattr(standins, stand_in, None)):
                problems.append(
                    f"{where}: stand-in {stand_in!r} is not in transformer_lab.standins"
                )
        for dotted in part.kit:
            module, _, name = dotted.rpartition(".")
            try:
                target = importlib.import_module(module)
            except ImportError:  # a method: transformer_lab.tokenizers.CharTokenizer.fit
                module, _, owner = module.rpartition(".")
                target = getattr(importlib.import_module(module), owner, None)
            if getattr(target, name, None) is None or GRADED.get(dotted) != lab:
                problems.append(f"{where}: kit {dotted!r} is not an @graded({lab!r}) answer")
        own = set(cells.get(part.name, {}))
        for key, lost in part.mistakes.items():
            foreign = sorted(set(lost) - own)
            if not lost or foreign:
                problems.append(
                    f"{where}: mistake {key!r} of {part.name} must cost cells of {part.name} "
                    f"only, and some: {foreign or 'none given'}"
                )
        problems += _lint_part_bans(lab_spec, part, where)
        problems += _lint_part_notebook(part, nb, where)
        earlier.append(part.name)
    return problems + _lint_bans(lab_spec, where)


def _headings(nb: Any) -> dict[str, int]:
    """Part name -> the points its ``### Exercise k (P points): `name``` heading gives."""
    return {
        found.group(3): int(found.group(2))
        for cell in nb.cells
        if cell.cell_type == "markdown"
        for found in EXERCISE_HEADING.finditer(cell.source)
    }


def solution_definitions(nb: Any) -> dict[str, ast.FunctionDef | ast.ClassDef]:
    """Name -> the first top-level ``def`` or ``class`` of that name in a solution cell."""
    found: dict[str, ast.FunctionDef | ast.ClassDef] = {}
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type != "code" or not meta.get("solution"):
            continue
        try:
            tree = parse_python(cell.source)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                found.setdefault(node.name, node)
    return found


def _without_self(args: ast.arguments) -> ast.arguments:
    """A method's arguments without its first (``self``)."""
    head = "posonlyargs" if args.posonlyargs else "args"
    rest = getattr(args, head)[1:]
    return ast.arguments(**{**{f: getattr(args, f) for f in args._fields}, head: rest})


def _defined_signatures(node: ast.FunctionDef | ast.ClassDef) -> dict[str, str]:
    """``name -> "name(args)"`` of a solution's function, or of a class's constructor (under
    the class's name) and methods."""
    if isinstance(node, ast.FunctionDef):
        return {node.name: f"{node.name}({arguments_text(node.args)})"}
    out = {node.name: f"{node.name}()"}
    for item in node.body:
        if isinstance(item, ast.FunctionDef):
            name = node.name if item.name == "__init__" else item.name
            out[name] = f"{name}({arguments_text(_without_self(item.args))})"
    return out


def _self_assigned(node: ast.AST) -> set[str]:
    """The attributes a class's code assigns on ``self`` (``self.norm1 = ...``, also in a tuple
    or an annotated assignment); reads such as ``self.norm1(x)`` do not count."""
    targets = [
        target
        for n in ast.walk(node)
        if isinstance(n, ast.Assign | ast.AnnAssign)
        for target in (n.targets if isinstance(n, ast.Assign) else [n.target])
    ]
    return {
        t.attr
        for target in targets
        for t in ast.walk(target)
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
    }


def _lint_part_notebook(part: Part, nb: Any, where: str) -> list[str]:
    """The part's points agree with its exercise heading (and so, by the lab standard,
    :func:`~transformer_lab.grading.standard.lint_lab`, with the nbgrader points of its test
    cells and the intro's table), its signature and methods with the solution cell's ``def``
    or ``class``, and the class sets the attributes the checks read."""
    problems = []
    heading = _headings(nb).get(part.name)
    if part.points is None:
        problems.append(f"{where}: {part.name} declares no points (its heading gives {heading})")
    elif heading != part.points:  # the lab standard holds the heading to its test cells
        problems.append(
            f"{where}: {part.name} is worth {part.points} points; the notebook's heading gives "
            f"{heading}"
        )
    node = solution_definitions(nb).get(part.name)
    if not part.signature:
        return [*problems, f"{where}: {part.name} declares no signature"]
    if node is None:
        return [*problems, f"{where}: no solution cell defines {part.name}"]
    assigned = _self_assigned(node)
    for name in part.attribute_names:
        if name not in assigned:
            problems.append(f"{where}: {part.name}'s solution has no attribute {name}")
    defined = _defined_signatures(node)
    for signature in (part.signature, *part.methods):
        name, args = signature_arguments(signature, f"{where}: {part.name}")
        wanted = f"{name}({arguments_text(args)})"
        if defined.get(name) != wanted:
            problems.append(
                f"{where}: {part.name}'s signature {wanted} is not the solution's "
                f"{defined.get(name, 'none')}"
            )
    return problems


def _lint_part_bans(lab_spec: LabSpec, part: Part, where: str) -> list[str]:
    """A part's bans exist, and refuse each of its kit answers (else a student could call it)."""
    problems = [
        f"{where}: {part.name} names the ban {name!r}; the spec has {sorted(lab_spec.bans)}"
        for name in part.bans
        if name not in lab_spec.bans
    ]
    tables = [lab_spec.bans[name] for name in part.bans if name in lab_spec.bans]
    for dotted in part.kit:
        if not any(table.refuses(dotted) for table in tables):
            problems.append(
                f"{where}: {part.name}'s kit answer {dotted!r} is refused by none of its bans "
                f"{list(part.bans)}: a student could call it"
            )
    return problems


def _lint_bans(lab_spec: LabSpec, where: str) -> list[str]:
    """Every ban is held by some part, names real torch op families or operators and real
    functions, classes or modules."""
    import torch

    from transformer_lab.judge.bans import OP_FAMILIES, _resolve

    used = {name for part in lab_spec.parts.values() for name in part.bans}
    problems = [
        f"{where}: no part holds the ban {name!r}" for name in lab_spec.bans if name not in used
    ]
    for name, table in lab_spec.bans.items():
        for op in table.ops:
            if op not in OP_FAMILIES and not hasattr(torch.ops.aten, op):
                problems.append(f"{where}: bans.{name} refuses {op!r}, no op family or operator")
        for dotted in table.functions:
            try:
                _resolve(dotted)
            except (ImportError, AttributeError):
                problems.append(f"{where}: bans.{name} refuses {dotted!r}, which does not exist")
        if not table.reason:
            problems.append(f"{where}: bans.{name} gives no reason (the refusal says it)")
    return problems


def costs_table(specs: list[LabSpec], notebooks: dict[str, Any]) -> str:
    """The curriculum's markdown table of graded parts: points, what each builds on, how many
    typical mistakes the kit catalogues and what one costs (fewest-most points)."""
    rows = [
        "| lab | graded part | points (test cells) | builds on | "
        "catalogued mistakes | points one costs |",
        "|---|---|---|---|---|---|",
    ]
    for spec in specs:
        cells = parts_of(notebooks[spec.lab])
        for part in spec.parts.values():
            own = cells.get(part.name, {})
            costs = [sum(own.get(c, 0) for c in lost) for lost in part.mistakes.values()]
            spent = f"{min(costs)}-{max(costs)}" if costs else "-"
            if costs and min(costs) == max(costs):
                spent = str(costs[0])
            leans = ", ".join(f"`{p}`" for p in part.builds_on) or "-"
            rows.append(
                f"| {spec.lab[:2]} | `{part.name}` | {sum(own.values())} ({len(own)}) | {leans} "
                f"| {len(part.mistakes)} | {spent} |"
            )
    return "\n".join(rows)


def _written_calls(text: str) -> dict[str, set[str]]:
    """``name -> {"name(args)", ...}`` of every call written in backticks in ``text``
    (`` `class Name(a, b=1) -> ...` ``: what follows the closing parenthesis is left out)."""
    out: dict[str, set[str]] = {}
    for span in re.findall(r"`([^`]+)`", text):
        span = span.removeprefix("class ").strip()
        head = re.match(r"[A-Za-z_]\w*\(", span)
        depth, end = 0, None
        for i, char in enumerate(span if head else ""):
            depth += (char == "(") - (char == ")")
            if char == ")" and depth == 0:
                end = i + 1
                break
        if end is None:
            continue
        try:
            name, args = signature_arguments(span[:end], "a call")
        except SpecError:  # `self_attention_matrix(...)`: no signature
            continue
        out.setdefault(name, set()).add(f"{name}({arguments_text(args)})")
    return out


def lint_curriculum(specs: list[LabSpec], markdown: str) -> list[str]:
    """Every part whose signature (or a class's method) the curriculum's row of its lab
    (``| NN_name | ... |``) does not write as the spec declares it."""
    problems = []
    for lab_spec in specs:
        row = next(
            (line for line in markdown.splitlines() if line.startswith(f"| {lab_spec.lab} |")), ""
        )
        if not row:
            problems.append(f"the curriculum has no row for {lab_spec.lab}")
            continue
        written = _written_calls(row)
        for part in lab_spec.parts.values():
            for signature in filter(None, (part.signature, *part.methods)):
                name, args = signature_arguments(signature, f"{lab_spec.lab}: {part.name}")
                wanted = f"{name}({arguments_text(args)})"
                if wanted not in written.get(name, set()):
                    found = " or ".join(sorted(written.get(name, set()))) or f"no {name}(...)"
                    problems.append(
                        f"the curriculum's row of {lab_spec.lab} writes {found}; its spec: {wanted}"
                    )
    return problems


def lint_readme(specs: list[LabSpec], markdown: str) -> list[str]:
    """Where README's lab table (``| NN_name | topic | students write |``) does not list the
    lab's graded parts as its spec does: every part, in the spec's order, each name in
    backticks; a class part may be followed by its methods (`` `TaggingModule` (`training_step`,
    `configure_optimizers`) ``), and nothing else in backticks."""
    problems = []
    for lab_spec in specs:
        row = next((ln for ln in markdown.splitlines() if ln.startswith(f"| {lab_spec.lab} |")), "")
        if not row:
            problems.append(f"README's lab table has no row for {lab_spec.lab}")
            continue
        written = re.findall(r"`([A-Za-z_]\w*)`", row.rstrip(" |").rpartition("|")[2])
        methods = {m.partition("(")[0] for part in lab_spec.parts.values() for m in part.methods}
        listed = [name for name in written if name not in methods or name in lab_spec.parts]
        if listed != list(lab_spec.parts):
            problems.append(
                f"README's row of {lab_spec.lab} lists {', '.join(listed) or 'no part'}; "
                f"its spec: {', '.join(lab_spec.parts)}"
            )
    return problems
