"""The student's own answers, carried from lab to lab, and what stands in for the missing ones.

A student package locks the kit's answer to every lab whose deadline has not passed
(:mod:`transformer_lab.graded`), yet later labs and the kit's own machinery (models, ``fit``,
``generate``) are built on those answers. This module fills each locked answer, once, in this
order, and says which it used:

1. **the student's saved answer**: when a lab's visible check passes, :func:`save` writes the
   source of the student's function or class (never a pickle), with the imports, constants and
   helpers it uses read from the student's cells (:mod:`transformer_lab.answer_source`), into
   ``my_answers/labNN.py``, a small module the student keeps (beside the notebooks, in Drive
   when it is mounted on Colab, or anywhere ``TRANSFORMER_LAB_ANSWERS`` names);
   :func:`install` runs those modules and puts their definitions where the kit's locked ones
   were;
2. **the kit's answer**, once its lab is closed (the stub is not locked any more: nothing to do);
3. **a stand-in built from PyTorch's own modules** (:mod:`transformer_lab.standins`), which
   reveals nothing PyTorch does not;
4. otherwise the locked stub stays, and whatever needs it says in one line which lab's answer
   it lacks (:class:`~transformer_lab.graded.LockedAnswerError`).

A saved answer is checked again when it is loaded (its visible check, quietly): one that fails
is still used, since it is the student's, and the one line says so, so a later lab's surprising
figure can be traced to it. Grading never sees any of this: the grader's kernel loads no saved
answer (``TRANSFORMER_LAB_GRADING`` is set there) and the graded lab's own checks compute with
their own references.

:data:`ANSWERS` is the one table, derived from the labs' specs: which name each lab asks for,
which kit object it replaces, and which visible check judges it; and the kit pieces a lab grades
only through another answer (lab 04's loss, logging and optimizer, which every kit
LightningModule calls: lab 08 trains one), which no notebook defines, so that only a stand-in
fills them (``asked=False``).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import inspect
import io
import os
import re
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformer_lab import answer_source, graded
from transformer_lab.checks.spec import LabSpec, all_specs
from transformer_lab.pysource import parse_python

__all__ = [
    "ANSWERS",
    "ANSWERS_ENV",
    "Answer",
    "Installed",
    "answers_folder",
    "how_to_get",
    "install",
    "kit_object",
    "load_saved",
    "save",
    "summary",
]

#: Environment variable naming the folder of saved answers (overrides the search).
ANSWERS_ENV = "TRANSFORMER_LAB_ANSWERS"
#: Set in the grader's kernel (:mod:`transformer_lab.grading.grade`): no saved answer is loaded.
GRADER_ENV = "TRANSFORMER_LAB_GRADING"
FOLDER = "my_answers"
DRIVE = Path("/content/drive/MyDrive")
_LAB = re.compile(r"^\d\d_[a-z0-9_]+$")


@dataclass(frozen=True)
class Answer:
    """One graded name a lab asks the student to write.

    Attributes:
        name: the name the notebook defines (``"MultiHeadAttention"``).
        lab: the lab that grades it (``"03_multi_head_attention"``).
        check: the visible check that judges it, ``"labNN.check_..."``.
        kit: dotted name of the kit's object it stands for; None where the kit has none with
            the same interface (the student's own LightningModules).
        asked: False for a kit piece that the lab grades through another answer (lab 04's
            loss, logging and optimizer, graded through the student's ``TaggingModule``): the
            notebook defines no such name, so none is saved or loaded; only a stand-in fills it.
    """

    name: str
    lab: str
    check: str
    kit: str | None = None
    asked: bool = True

    def check_function(self) -> Callable[[Any], None]:
        module, _, name = self.check.partition(".")
        return getattr(importlib.import_module(f"transformer_lab.checks.{module}"), name)


def _answers_of(lab_spec: LabSpec) -> list[Answer]:
    """The answers one lab's spec declares: each part saved on its visible check (``check``,
    unless ``saved = false``) standing for its kit answer of the same name, then the kit pieces
    the lab grades through it (``pieces``), which no notebook defines."""
    prefix = f"lab{lab_spec.lab[:2]}."
    out = []
    for part in lab_spec.parts.values():
        if part.saved:
            out.append(Answer(part.name, lab_spec.lab, prefix + part.check, part.kit_answer))
        out += [
            Answer(dotted.rpartition(".")[2], lab_spec.lab, prefix + check, dotted, asked=False)
            for dotted, check in part.pieces.items()
        ]
    return out


#: Every lab's answers, derived from the specs (:mod:`transformer_lab.checks.spec`).
ANSWERS: tuple[Answer, ...] = tuple(a for s in all_specs() for a in _answers_of(s))


def _by_name(lab: str | None = None) -> dict[str, Answer]:
    """The answers the notebooks ask for (of ``lab``), by name."""
    return {a.name: a for a in ANSWERS if a.asked and (lab is None or a.lab == lab)}


# --------------------------------------------------------------------------------------
# Where the answers live
# --------------------------------------------------------------------------------------


def how_to_get(name: str) -> str | None:
    """How a student gets the locked answer ``name`` that a notebook asks for (saved when its
    visible check passes); None for a name no notebook asks for (:data:`graded.HOW_TO_GET`)."""
    if any(a.name == name and a.kit and a.asked for a in ANSWERS):
        return (
            "which this student package does not hold yet: pass its visible check in that "
            f"lab's notebook (your answer is saved to {answers_folder()} and used from then on), "
            "or reinstall the kit after the lab's deadline."
        )
    return None


graded.HOW_TO_GET.append(how_to_get)


def answers_folder(cwd: Path | None = None) -> Path:
    """The folder of saved answers (it may not exist yet).

    ``$TRANSFORMER_LAB_ANSWERS`` if set; else ``MyDrive/my_answers`` when Google Drive is
    mounted on Colab; else an existing ``my_answers/`` here or one folder up; else
    ``my_answers/`` beside the lab folders (one up from a folder named like ``03_...``) or here.
    """
    if os.environ.get(ANSWERS_ENV, "").strip():
        return Path(os.environ[ANSWERS_ENV]).expanduser()
    if DRIVE.is_dir():
        return DRIVE / FOLDER
    here = (cwd or Path.cwd()).resolve()
    for place in (here, here.parent):
        if (place / FOLDER).is_dir():
            return place / FOLDER
    return (here.parent if _LAB.match(here.name) else here) / FOLDER


def _file(folder: Path, lab: str) -> Path:
    return folder / f"lab{lab[:2]}.py"


# --------------------------------------------------------------------------------------
# Saving: the source of the student's definitions, not pickles
# --------------------------------------------------------------------------------------


def _definitions(source: str) -> dict[str, str]:
    """Top-level ``name -> source`` (decorators included) of the functions and classes."""
    try:
        tree = parse_python(source)
    except SyntaxError:
        return {}
    lines = source.splitlines()
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
            out[node.name] = "\n".join(lines[first : node.end_lineno])
    return out


def _source_of(name: str, obj: Any) -> str | None:
    """The source of the definition of ``name``, read from the cell (or file) that defined it.

    IPython keeps every cell's source in :mod:`linecache` under the file name its code carries;
    a class is found through the code of one of its methods.
    """
    import linecache

    functions = [obj] if not isinstance(obj, type) else list(vars(obj).values())
    for func in functions:
        func = getattr(func, "__func__", func)
        code = getattr(inspect.unwrap(func), "__code__", None) if callable(func) else None
        if code is None:
            continue
        found = _definitions("".join(linecache.getlines(code.co_filename))).get(name)
        if found:
            return found
    return None


def _kit_home(name: str, value: Any) -> str | None:
    """The kit module the notebook imported ``name`` from (it may hold an installed answer)."""
    import sys

    answer = _by_name().get(name)
    if answer is not None and answer.kit and kit_object(answer.kit) is value:
        return answer.kit.rpartition(".")[0]
    if not (getattr(value, "__module__", None) or "").startswith(("transformer_lab", "my_answers")):
        return None
    for module_name, module in sorted(sys.modules.items()):
        if module_name.startswith("transformer_lab.") and getattr(module, name, None) is value:
            return module_name
    return None


def _import_line(name: str, value: Any) -> str | None:
    """How a saved file binds ``name``, which no statement of the student's cells binds."""
    kit = _kit_home(name, value)
    if kit is not None:
        return f"from {kit} import {name}"
    return answer_source.namespace_line(name, value)


_HEADER = """\"\"\"Your answers to lab {lab}, saved when their visible checks passed.

Later labs load this file (keep it beside your notebooks, or in Drive on Colab).
Edit it only to fix an answer; rerunning the lab overwrites what it saves.\"\"\"

from __future__ import annotations
"""


def _target(name: str, source: str, history: list[answer_source.Statement], at: int):
    """The statement of the answer's definition: where its cell ran, else after everything."""
    same = [s for s in history if s.source == source and name in s.binds]
    if same:
        return same[-1]
    (statement,) = answer_source.statements(source, at) or [None]
    return statement


def compose(
    lab: str, name: str, source: str, namespace: Mapping[str, Any], old: str = ""
) -> tuple[str, dict[str, str]]:
    """The text of ``lab``'s saved file with ``name`` defined by ``source``, and the names its
    answers use that the file cannot define (``name -> why``).

    What each answer needs is read from the student's cells (:mod:`transformer_lab.answer_source`):
    the file ``old`` (answers saved before, with what they needed), then the kernel's cells.
    """
    kept_part = answer_source.statements(old, trusted=True)
    cells = [*kept_part]
    for cell in answer_source.cell_sources(namespace):
        cells += answer_source.statements(cell, len(cells))
    if not answer_source.cell_sources(namespace):  # outside IPython: the answer's own file
        cells += answer_source.statements(_whole_file_of(namespace.get(name)), len(cells))
    asked = [a.name for a in ANSWERS if a.asked and a.lab == lab]
    targets = []
    for other in asked:
        if other == name:
            target = _target(name, source, cells, len(cells))
        else:
            defined = [s for s in kept_part if s.kind == "definition" and other in s.binds]
            target = defined[-1] if defined else None
        if target is not None:
            targets.append(target)
    needs = answer_source.needed(targets, cells, namespace, import_line=_import_line)
    body = [*needs.lines, *(s.source for s in needs.statements)]
    imports = [b for b in body if b.startswith(("import ", "from "))]
    rest = [b for b in body if not b.startswith(("import ", "from "))]
    text = _HEADER.format(lab=lab) + "\n" + "\n".join(dict.fromkeys(imports))
    text += "\n\n\n" + "\n\n\n".join(rest) + "\n"
    return text, needs.missing


def _whole_file_of(obj: Any) -> str:
    """The source of the file (or cell) that defined ``obj``, from :mod:`linecache`."""
    import linecache

    functions = [obj] if not isinstance(obj, type) else list(vars(obj).values())
    for func in functions:
        func = getattr(func, "__func__", func)
        code = getattr(inspect.unwrap(func), "__code__", None) if callable(func) else None
        if code is not None:
            return "".join(linecache.getlines(code.co_filename))
    return ""


def save(lab: str, name: str, obj: Any, namespace: Mapping[str, Any]) -> Path | None:
    """Save the student's ``name`` (whose visible check just passed) into ``my_answers/labNN.py``.

    The file keeps every answer of that lab saved so far, each with what it needs from the
    student's cells (imports, constants, helpers: :func:`compose`); ``name``'s definition
    replaces an older one. Nothing is written where the source cannot be found or the answer
    is not in :data:`ANSWERS`. A name the saved file cannot define, or a file that does not run,
    is said in one line now, when the check passes, not when a later lab loads the file.

    Returns:
        The file written, or None.
    """
    if name not in _by_name(lab) or os.environ.get(GRADER_ENV):
        return None
    source = _source_of(name, obj)
    if source is None:
        return None
    path = _file(answers_folder(), lab)
    old = path.read_text(encoding="utf-8") if path.is_file() else ""
    text, missing = compose(lab, name, source, {**namespace, name: obj}, old)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError:
        return None
    problem = _saved_problem(path, missing)
    if problem:
        print(
            f"Warning: your {name} was saved to {path}, but {problem}: later labs cannot use "
            f"it. Import or define what it needs in the cell of {name}, then rerun this check."
        )
    return path


def _saved_problem(path: Path, missing: Mapping[str, str]) -> str:
    """Why the saved file would not give later labs its answers ("" when it would)."""
    if missing:
        return "that file cannot define " + "; ".join(f"{n} ({why})" for n, why in missing.items())
    _, reason = _run_file(path, f"my_answers.check_{path.stem}")
    return reason


# --------------------------------------------------------------------------------------
# Loading and installing
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Installed:
    """What stands where a locked kit answer was: ``how`` is ``"saved"``, ``"stand-in"`` or
    ``"missing"``, with ``", wrong"`` added where the saved answer fails its visible check or
    its file does not run (``reason`` says why)."""

    answer: Answer
    how: str
    reason: str = ""


def _load_saved(
    folder: Path, labs: Iterable[str], spaces: list[dict[str, Any]] | None = None
) -> dict[str, tuple[Any, str]]:
    """``name -> (object, "")`` from the saved files of ``labs``; a file that fails to run gives
    ``(None, reason)`` for its names. Each module's namespace is appended to ``spaces`` (later
    installs fill the kit names it imported)."""
    found: dict[str, tuple[Any, str]] = {}
    for lab in sorted(set(labs)):
        path = _file(folder, lab)
        if not path.is_file():
            continue
        module, reason = _run_file(path, f"my_answers.lab{lab[:2]}")
        if module is None:  # a broken file must not stop the notebook
            for name in _by_name(lab):
                found[name] = (None, reason)
            continue
        if spaces is not None:
            spaces.append(module.__dict__)
        for name in _by_name(lab):
            if name in module.__dict__:
                found[name] = (module.__dict__[name], "")
    return found


def _run_file(path: Path, module_name: str) -> tuple[types.ModuleType | None, str]:
    """Run a saved file as a module: ``(module, "")``, or ``(None, why it does not run)``.

    PyTorch's random numbers are left as they were (a saved constant may draw some), so a
    notebook's seeded demos print the same numbers with or without saved answers.
    """
    import torch

    module = types.ModuleType(module_name)
    module.__file__ = str(path)
    try:
        source = path.read_text(encoding="utf-8")
        with torch.random.fork_rng(devices=[]):
            exec(compile(source, str(path), "exec"), module.__dict__)  # the student's own file
    except Exception as exc:
        return None, f"{path.name} does not run ({type(exc).__name__}: {exc})"
    return module, ""


def load_saved(lab: str) -> dict[str, Any]:
    """The student's saved answers of ``lab`` that run (none in the grader's kernel)."""
    if os.environ.get(GRADER_ENV):
        return {}
    found = _load_saved(answers_folder(), [lab])
    return {name: obj for name, (obj, _) in found.items() if obj is not None}


def _passes(answer: Answer, obj: Any) -> str:
    """Empty if ``obj`` passes its visible check, else the check's first line."""
    quiet = io.StringIO()
    try:
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            answer.check_function()(obj)
    except Exception as exc:  # any failure is "does not pass"
        return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return ""


def _replace(old: Any, new: Any, namespaces: Iterable[dict[str, Any]] = ()) -> None:
    """Put ``new`` wherever a loaded ``transformer_lab`` module (or one of ``namespaces``, a
    notebook's) holds ``old``, and under the kit's classes that were built on ``old`` (lab 08's
    attention on lab 03's)."""
    import sys

    kit = [
        vars(module)
        for name, module in list(sys.modules.items())
        if name == "transformer_lab" or name.startswith("transformer_lab.")
    ]
    for space in [*kit, *namespaces]:
        for attr, value in list(space.items()):
            if value is old:
                space[attr] = new
            elif isinstance(value, type) and isinstance(old, type) and old in value.__bases__:
                with contextlib.suppress(TypeError):  # an incompatible layout keeps the lock
                    value.__bases__ = tuple(new if b is old else b for b in value.__bases__)


def kit_object(dotted: str) -> Any:
    """The kit's object at ``dotted`` (``"transformer_lab.positional.sinusoidal_encoding"``),
    or None where this install has none."""
    module, _, name = dotted.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def _signature(func: Any, method: bool = False) -> tuple[set[str], int, bool, bool] | None:
    """``(keyword names, positional count, takes *args, takes **kwargs)`` of ``func`` (without
    ``self`` for a ``method``)."""
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return None
    kinds = inspect.Parameter
    positional = [
        p for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
    ]
    names = {p.name for p in params if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)}
    return (
        names,
        len(positional),
        any(p.kind is kinds.VAR_POSITIONAL for p in params),
        any(p.kind is kinds.VAR_KEYWORD for p in params),
    )


def _trim(sig: tuple[set[str], int, bool, bool] | None, args: tuple, kwargs: dict) -> tuple:
    """The arguments the student's signature takes (the kit passes more: dropout, eps...)."""
    if sig is None:
        return args, kwargs
    names, count, var_args, var_kwargs = sig
    kept_args = args if var_args else args[:count]
    kept = kwargs if var_kwargs else {k: v for k, v in kwargs.items() if k in names}
    return kept_args, kept


def _fit_interface(theirs: Any, name: str, lab: str) -> Any:
    """The student's ``theirs`` behind the kit's wider interface.

    The kit's callers pass options a lab's answer need not take (``dropout``, ``need_weights``,
    ``is_causal``...): those the student's signature lacks are left out (``is_causal`` becomes a
    causal mask), and a KV cache it cannot take is refused with a line naming the lab.
    """
    if isinstance(theirs, type):
        init = _signature(theirs.__init__, method=True)
        forward = _signature(getattr(theirs, "forward", None), method=True)

        def init_(self: Any, *args: Any, **kwargs: Any) -> None:
            kept_args, kept = _trim(init, args, kwargs)
            theirs.__init__(self, *kept_args, **kept)

        def forward_(self: Any, *args: Any, **kwargs: Any) -> Any:
            takes = forward[0] if forward else set()
            if kwargs.get("kv_cache") is not None and "kv_cache" not in takes:
                raise NotImplementedError(
                    f"your saved {name} (lab {lab}) takes no kv_cache: the kit's decoding with a "
                    "cache needs one; decode without a cache (use_cache=False)"
                )
            if kwargs.pop("is_causal", False) and "is_causal" not in takes:
                from transformer_lab.masks import causal_mask

                kwargs["mask"] = causal_mask(args[0].shape[1], device=args[0].device)
            kept_args, kept = _trim(forward, args, kwargs)
            return theirs.forward(self, *kept_args, **kept)

        body = {"__init__": init_, "__module__": theirs.__module__}
        if forward is not None:
            body["forward"] = forward_
        fitted = type(name, (theirs,), body)
        fitted.__qualname__ = theirs.__qualname__
        return fitted
    if not callable(theirs):
        return theirs
    if name == "combine_masks":
        return _combine_masks_taking_none(theirs)
    sig = _signature(theirs)
    if sig is None or sig[3]:
        return theirs

    @functools.wraps(theirs)
    def fitted_function(*args: Any, **kwargs: Any) -> Any:
        kept_args, kept = _trim(sig, args, kwargs)
        return theirs(*kept_args, **kept)

    return fitted_function


def _combine_masks_taking_none(theirs: Callable[..., Any]) -> Callable[..., Any]:
    """Lab 05's ``combine_masks`` takes two masks; the kit's callers pass None for "no mask",
    which PyTorch's own combination (the stand-in) handles."""
    from transformer_lab.standins import STAND_INS

    torch_combine = STAND_INS["transformer_lab.masks.combine_masks"]

    @functools.wraps(theirs)
    def combine_masks(padding: Any, causal: Any) -> Any:
        if padding is None or causal is None:
            return torch_combine(padding, causal)
        return theirs(padding, causal)

    return combine_masks


def install(
    before: str | None = None,
    *,
    saved: bool = True,
    stand_ins: bool = True,
    namespaces: Iterable[dict[str, Any]] = (),
) -> list[Installed]:
    """Fill every locked kit answer of the labs before ``before`` (all labs when None).

    Lab by lab, in course order, so a saved answer that imports an earlier one from the kit
    (``from transformer_lab.attention import MultiHeadAttention``) gets what was installed.

    Args:
        before: the lab being worked on; its own answers and later ones are left locked (the
            student writes them), so that no answer of this lab can lean on a stand-in.
        saved: load the student's saved answers (never in the grader's kernel).
        stand_ins: fill the rest with PyTorch stand-ins (not for weights trained elsewhere:
            a stand-in's parameters are laid out as PyTorch's, not as the kit's).
        namespaces: more places to fill (the notebook's globals, which imported kit names).

    Returns:
        One :class:`Installed` per locked answer that was looked at, in course order.
    """
    from transformer_lab import standins
    from transformer_lab.graded import is_locked
    from transformer_lab.judge.bans import exempt

    spaces = list(namespaces)
    wanted = [a for a in ANSWERS if a.kit and (before is None or a.lab < before)]
    locked = [(a, obj) for a in wanted if (obj := kit_object(a.kit)) is not None and is_locked(obj)]
    use_saved = saved and not os.environ.get(GRADER_ENV)
    folder = answers_folder()
    done: list[tuple[Answer, Any, Any, Any, str, str]] = []
    for lab in sorted({a.lab for a, _ in locked}):
        mine = _load_saved(folder, [lab], spaces) if use_saved else {}
        for answer, stub in [(a, o) for a, o in locked if a.lab == lab]:
            theirs, broken = mine.get(answer.name, (None, ""))
            if theirs is not None:
                fitted = _fit_interface(theirs, answer.name, answer.lab)
                _replace(stub, fitted, spaces)
                done.append((answer, stub, fitted, theirs, "saved", ""))
                continue
            stand_in = standins.STAND_INS.get(answer.kit) if stand_ins else None
            if stand_in is not None:
                _replace(stub, stand_in, spaces)
                exempt(stand_in)
            how = "stand-in" if stand_in is not None else "missing"
            done.append((answer, stub, stand_in, None, how, broken))
        # The lab's own classes that no kit object stands for (lab 04's TaggingModule): saved
        # or not, they are the student's parts of that lab.
        for answer in [a for a in ANSWERS if a.lab == lab and a.asked and a.kit is None]:
            theirs, broken = mine.get(answer.name, (None, ""))
            how = "saved" if theirs is not None else ("broken" if broken else "absent")
            done.append((answer, None, None, theirs, how, broken))
    out = []
    for answer, _stub, _fitted, theirs, how, broken in done:  # checked once all is in place
        # A check's ban knows the kit's code by identity: the student's answers installed in
        # the kit's places are theirs, and calling them passes.
        failure = _passes(answer, theirs) if how == "saved" else broken
        out.append(Installed(answer, f"{how}, wrong" if failure and how != "broken" else how,
                             failure))  # fmt: skip
    return out


def whose_code(installed: Iterable[Installed]) -> str:
    """One line saying whose code stands where the kit's answers are locked: the student's saved
    answers (from which labs), PyTorch stand-ins ("" where no answer is locked)."""
    items = [i for i in installed if i.answer.asked and i.answer.kit]
    if not items:
        return ""
    saved = {i.answer.lab[:2] for i in items if i.how.startswith("saved")}
    stand_in = {i.answer.lab[:2] for i in items if i.how.startswith("stand-in")} - saved
    folder = answers_folder()
    if saved:
        said = f"runs on your saved answers from labs {_span(saved)} ({folder})"
        return said + (f" and PyTorch stand-ins for labs {_span(stand_in)}" if stand_in else "")
    if stand_in:
        return (
            f"runs on PyTorch stand-ins for labs {_span(stand_in)} (no saved answers in {folder})"
        )
    return f"finds no saved answers in {folder}"


def _span(labs: Iterable[str]) -> str:
    """``"01-04"`` for consecutive lab numbers, else ``"01, 03"``."""
    numbers = sorted(int(n) for n in labs)
    if len(numbers) > 1 and numbers == list(range(numbers[0], numbers[-1] + 1)):
        return f"{numbers[0]:02d}-{numbers[-1]:02d}"
    return ", ".join(f"{n:02d}" for n in numbers)


def summary(installed: Iterable[Installed], folder: Path | None = None) -> list[str]:
    """What a notebook's setup says about the earlier labs' answers: one line listing the
    student's saved answers that pass their checks, and one line for each lab that is not
    wholly so (a saved answer that fails, a file that does not run, parts not saved: what is
    used instead). A correct student who took every earlier lab sees the first line only."""
    items = [i for i in installed if i.answer.asked]
    good = [i.answer for i in items if i.how == "saved"]
    lines = [f"Your saved answers: {_names(good)}."] if good else []
    for lab in sorted({i.answer.lab for i in items}):
        line = _lab_line(lab, [i for i in items if i.answer.lab == lab], folder)
        if line:
            lines.append(line)
    return lines


def _names(answers: Iterable[Answer]) -> str:
    labs: dict[str, list[str]] = {}
    for a in answers:
        labs.setdefault(a.lab[:2], []).append(a.name)
    return "; ".join(f"{', '.join(n)} ({lab})" for lab, n in labs.items())


#: What a stand-in is, where it is not what the lab's answer computes.
_STAND_IN_NOTES = {
    "sinusoidal_encoding": "sinusoidal_encoding (random position codes, not sinusoids)"
}


def _first_sentence(text: str, most: int = 160) -> str:
    first = re.split(r"(?<=[.;:])\s", text.strip(), maxsplit=1)[0].rstrip(".;:")
    return first if len(first) <= most else first[: most - 3].rstrip() + "..."


def _lab_line(lab: str, items: list[Installed], folder: Path | None) -> str:
    """The one line about ``lab``'s answers that are not saved and passing ("" when all are)."""
    by: dict[str, list[Installed]] = {}
    for item in items:
        by.setdefault(item.how, []).append(item)

    def names(how: str) -> str:
        return ", ".join(i.answer.name for i in by.get(how, []))

    parts = []
    if by.get("saved, wrong"):
        first = _first_sentence(by["saved, wrong"][0].reason)
        parts.append(
            f"your saved {names('saved, wrong')} fail{'s' * (len(by['saved, wrong']) == 1)} "
            f"the visible check ({first}); the demos run on yours anyway: fix it there and "
            "rerun that lab"
        )
    broken = [i for i in items if i.how.endswith(", wrong") and i.how != "saved, wrong"]
    broken += by.get("broken", [])
    if broken:
        parts.append(f"your saved answers are not used: {broken[0].reason}")
    unsaved = [i for i in items if i.how.partition(",")[0] in ("stand-in", "missing")]
    if unsaved and not broken:
        none_saved = not any(i.how.startswith(("saved", "broken")) for i in items)
        parts.append("no saved answers (lab not taken yet)" if none_saved else
                     f"no saved {', '.join(i.answer.name for i in unsaved)}")  # fmt: skip
    if any(i.how.startswith("stand-in") for i in items):
        used = [i.answer.name for i in items if i.how.startswith("stand-in")]
        used = [_STAND_IN_NOTES.get(name, name) for name in used]
        parts.append(f"the demos use PyTorch stand-ins for {', '.join(used)}")
    if any(i.how.startswith("missing") for i in items):
        lost = [i.answer.name for i in items if i.how.startswith("missing")]
        where = folder or answers_folder()
        parts.append(
            f"nothing stands in for {', '.join(lost)} (no saved answer in {where}): the demos "
            "that need it are skipped"
        )
    return f"Lab {lab[:2]} ({lab}): " + "; ".join(parts) + "." if parts else ""
