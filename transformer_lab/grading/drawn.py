"""Cases drawn at grading time: a visible cell's points need more than its worked examples.

A visible check compares the student's function with expected values on a few fixed worked
examples, and those values ship in the student package (``checks/fixtures/labNN.json``): an
answer that looks the stored table up (returns the stored value for the stored inputs) would
pass them. So when the judge (:func:`~transformer_lab.grading.judge.judge_cell`) has passed a
visible cell, it also calls the student's function on inputs drawn now, from a seed drawn now
(``os.urandom``), one drawn case for each of the first calls the check made:

* each call the check made to a function of the notebook whose part's spec names a kit function
  of the same name (``parts.<name>.kit``) is a *template*, recorded with the student's answer;
* its inputs are redrawn keeping their structure: float and integer tensors get fresh values
  in the range the check's own had (same shape and dtype), a text's words are put in a new
  order, positive integer sizes are all multiplied by 2 (or 3), and failing those positive
  floats are scaled (:data:`_LADDER`, least change first);
* the kit's own implementation, run here in the grader and never sent to the kernel, is the
  oracle: a draw on which it raises, or gives a value less finite than on the check's inputs,
  is replaced by the next; a part whose kit answer differs twice on the same input (it draws
  random numbers) is skipped, as is a call with anything else than plain data among its inputs
  (a model, a function, an object of the student's);
* the student's answer must match the kit's in kind (float, integer, bool), shape and length,
  and in value at the lab's ``float32`` tolerance of its spec (``[tolerance]``; half-precision
  results at 16 times their eps; integers exactly).

A drawn case judges only what its cell judged on the check's own calls (:func:`agreement`):
where one of the student's answers there already differed from the kit's in value (and the cell
passed it: a shape check, a check of the loops' form), the drawn cases compare kind and shape
only; where one differed in those too, nothing is drawn. So a catalogued mistake still costs
exactly the cells its spec names, and an answer that returns the stored values for the stored
inputs (a table looked up) fails.

Out of reach: classes (``MultiHeadAttention``, ``CharTokenizer``) and their methods, whose
answers are per instance; functions taking models or functions (``greedy_decode``,
``generate``); functions of boolean masks only (``combine_masks``: no redraw keeps a causal
mask causal). Their visible points rest on the worked examples and the hidden checks.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import math
import os
import random
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from transformer_lab.checks.spec import all_specs
from transformer_lab.graded import KIT_ORIGINALS, is_locked

__all__ = [
    "DRAWN_PER_CELL",
    "RECORDED_PER_CELL",
    "Call",
    "Drawn",
    "DrawnMismatchError",
    "Recorder",
    "agreement",
    "draw",
    "judge",
    "kit_answer",
]

#: How many of a cell's recorded calls get one drawn case each (the first distinct ones).
DRAWN_PER_CELL = 3
#: How many distinct calls of a cell are recorded: what the cell judged is read from all of
#: them (:func:`agreement`), the drawn cases from the first :data:`DRAWN_PER_CELL`.
RECORDED_PER_CELL = 16

#: The tolerance of a part whose lab's spec names no ``float32`` one.
_DEFAULT_TOL = 1e-4

#: What each attempt redraws, least change first: the first draw that changes the inputs and
#: on which the kit's answer is as finite as on the check's own is the drawn case.
_LADDER: tuple[frozenset[str], ...] = (
    frozenset({"tensors", "strings"}),
    frozenset({"tensors"}),
    frozenset({"tensors", "ints"}),
    frozenset({"ints"}),
    frozenset({"floats"}),
    frozenset({"ints", "floats"}),
)

#: A call whose answer has not come back (it raised, or is still running).
_UNANSWERED: Any = object()

#: Values kept as they are in a drawn case (and allowed in a template's inputs).
_CONSTANTS = (type(None), torch.dtype, torch.device)


class DrawnMismatchError(AssertionError):
    """The student's answer on a drawn case is not the kit's (the visible cell fails)."""


@dataclass
class Call:
    """One call of the check to a student's function: its inputs as they went in."""

    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    ban: dict[str, Any] | None = None
    #: the student's answer to it, as data (:meth:`Recorder.answered`)
    got: Any = _UNANSWERED


@dataclass
class Recorder:
    """The calls a visible check made to the student's functions, by the Remote's handle.

    Attributes:
        watched: the handle of each function with a kit answer -> its notebook name.
        calls: the first distinct calls with plain-data inputs, their inputs copied before
            the call (the check and the student's code may write into them).
        drawn: the cases drawn from them so far (:func:`judge`).
    """

    watched: dict[int, str] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    drawn: list[Drawn] = field(default_factory=list)
    _keys: set[Any] = field(default_factory=set)

    def record(
        self, handle: int, args: Sequence[Any], kwargs: dict[str, Any], ban: Any
    ) -> Call | None:
        """Record a call about to be made; the record, for :meth:`answered`, or None (not a
        watched function, not plain data, one seen already, or enough recorded)."""
        name = self.watched.get(handle)
        if name is None or len(self.calls) >= RECORDED_PER_CELL:
            return None
        if not (_plain(list(args)) and _plain(kwargs)):
            return None
        call = Call(name, tuple(_copy(list(args))), _copy(dict(kwargs)), ban)
        key = (name, _key(call.args), _key(call.kwargs))
        if key in self._keys:
            return None
        self._keys.add(key)
        self.calls.append(call)
        return call

    def answered(self, call: Call | None, value: Any) -> None:
        """What the student's function returned for the recorded ``call``."""
        if call is not None and _plain(value):
            call.got = _copy(value)


@dataclass
class Drawn:
    """A drawn case: the call with its fresh inputs and the kit's answer on them."""

    call: Call
    expected: Any
    #: ``"values"``: the answer must match the kit's (the student's did on the check's own
    #: calls); ``"structure"``: only its kind, shape and length (the cell passed answers
    #: whose values differ from the kit's: what it judges is not the values)
    level: str = "values"

    def describe(self) -> str:
        """The call as the student would write it, tensors by dtype and shape."""
        shown = [_show(a) for a in self.call.args]
        shown += [f"{k}={_show(v)}" for k, v in self.call.kwargs.items()]
        return f"{self.call.name}({', '.join(shown)})"


@functools.cache
def kit_answer(name: str) -> tuple[Callable[..., Any], float, float] | None:
    """The kit's own function answering the notebook's function ``name``, with the
    ``(atol, rtol)`` of its lab's ``float32`` tolerance; None where no spec names a kit
    function of that name (a class, a method, a part without a kit answer) or it is locked."""
    for spec in all_specs():
        part = spec.parts.get(name)
        if part is None:
            continue
        for dotted in part.kit:
            module, _, last = dotted.rpartition(".")
            if last != name:
                continue
            with contextlib.suppress(ImportError):
                importlib.import_module(module)
            kit = KIT_ORIGINALS.get(dotted)
            if inspect.isfunction(kit) and not is_locked(kit):
                tol = spec.tolerance.get("float32", _DEFAULT_TOL)
                if isinstance(tol, dict):
                    return kit, tol["atol"], tol["rtol"]
                return kit, float(tol), float(tol)
    return None


#: The environment variable that pins the drawn cases' seed (an integer): for reproducing one
#: grading, and for the tests' contract that a catalogued mistake costs exactly its cells. The
#: grader's environment is the instructor's, never the student's.
DRAW_SEED_ENV = "TRANSFORMER_LAB_DRAW_SEED"


def grading_seed() -> int:
    """The seed of this grading's drawn cases: :data:`DRAW_SEED_ENV` where it is set, else drawn
    now from ``os.urandom`` (a student cannot know it in advance)."""
    pinned = os.environ.get(DRAW_SEED_ENV, "").strip()
    if not pinned:
        return int.from_bytes(os.urandom(8), "little") >> 1
    try:
        return int(pinned) & (2**62 - 1)
    except ValueError:
        raise ValueError(f"{DRAW_SEED_ENV}={pinned!r} is not an integer seed") from None


def agreement(calls: Sequence[Call], seed: int) -> str | None:
    """What a passed cell judged of the answers to its recorded ``calls``, read from how they
    agree with the kit's: ``"values"`` (all of them match the kit's), ``"structure"`` (some
    differ in value only: the cell judges shapes, a loop's form ...), or None (some differ in
    kind or shape too, or none can be compared: the cell judges something else)."""
    levels = set()
    for call in calls:
        found = kit_answer(call.name)
        if found is None or call.got is _UNANSWERED:
            continue
        kit, atol, rtol = found
        try:
            original = _run_kit(kit, call, seed)
        except Exception:  # a case the check expects to raise: nothing to compare
            continue
        if not difference(call.got, original, atol, rtol):
            levels.add("values")
        elif not difference(call.got, original, atol, rtol, values=False):
            levels.add("structure")
        else:
            return None
    if not levels:
        return None
    return "structure" if "structure" in levels else "values"


def draw(call: Call, seed: int, level: str = "values") -> Drawn | None:
    """A drawn case of ``call`` from ``seed``, judged at ``level`` (:func:`agreement`), or
    None where none can be drawn (the kit raises on the check's own inputs, draws random
    numbers, or every draw fails)."""
    found = kit_answer(call.name)
    if found is None:
        return None
    kit = found[0]
    try:
        original = _run_kit(kit, call, seed)
    except Exception:  # a case the check expects to raise: no value to draw around
        return None
    rng = torch.Generator().manual_seed(seed)
    shuffler = random.Random(seed)
    factors = shuffler.sample((2, 3), 2)  # integer sizes times 2 or 3, the other one next
    for factor, how in [(f, how) for f in factors for how in _LADDER]:
        mutate = _Draw.of(how, rng, shuffler, factor)
        args = tuple(mutate(a, top=True) for a in call.args)
        kwargs = {k: mutate(v, top=True) for k, v in call.kwargs.items()}
        if (_key(args), _key(kwargs)) == (_key(call.args), _key(call.kwargs)):
            continue
        fresh = Call(call.name, tuple(args), kwargs, call.ban)
        try:
            expected, again = _run_kit(kit, fresh, seed), _run_kit(kit, fresh, seed)
        except Exception:
            continue
        if _key(expected) != _key(again):
            return None  # the kit draws random numbers: nothing to compare one call with
        if _finite(expected) or not _finite(original):
            return Drawn(fresh, expected, level)
    return None


def judge(
    recorder: Recorder,
    ask: Callable[[Call], Any],
    passing: tuple[type[BaseException], ...] = (),
) -> None:
    """Draw a case of each recorded call and ask the student's function (``ask``) for it.

    ``passing``: the exceptions of ``ask`` that pass through unchanged (the judge's own, no
    usable reply; a refused call, worded by the ban); any other is the student's, and fails.

    Each drawn case is added to ``recorder.drawn`` before it is asked (what this grading
    drew: another draws differently).

    Raises:
        DrawnMismatchError: an answer that differs from the kit's on a drawn case, or raised.
    """
    seed = grading_seed()
    level = agreement(recorder.calls, seed)
    if level is None:
        return
    for index, call in enumerate(recorder.calls):
        if len(recorder.drawn) >= DRAWN_PER_CELL:
            break
        case = draw(call, seed + index, level)
        if case is None:
            continue
        what = case.describe()
        recorder.drawn.append(case)
        fresh = Call(call.name, tuple(_copy(list(case.call.args))), _copy(case.call.kwargs))
        fresh.ban = call.ban
        try:
            with torch.no_grad():
                got = ask(fresh)
        except passing:
            raise
        except Exception as exc:
            raised = f"raised {type(exc).__name__}: {exc}"
            raise DrawnMismatchError(_lead(what) + raised) from None
        found = kit_answer(call.name)
        assert found is not None  # (draw found it)
        problem = difference(got, case.expected, found[1], found[2], values=case.level == "values")
        if problem:
            raise DrawnMismatchError(_lead(what) + problem)


def _lead(what: str) -> str:
    """The start of a drawn case's message: what happened, and the call (its inputs are
    fresh, so a visible cell may show them)."""
    return f"Your answer matches the worked examples but not a case drawn at grading time: {what} "


def difference(
    got: Any, want: Any, atol: float, rtol: float, where: str = "", values: bool = True
) -> str:
    """What differs between the student's value ``got`` and the kit's ``want`` ("" if none):
    kind, shape and length exactly; with ``values``, float values at ``atol``/``rtol`` and
    everything else exactly too."""
    at = f" (in item {where})" if where else ""
    if type(want) is torch.Tensor:
        return _tensor_difference(got, want, atol, rtol, at, values)
    if isinstance(want, bool | str) or want is None:
        if type(got) is type(want) and (got == want or not values):
            return ""
        return f"returned {_short(got)}, expected {_short(want)}{at}"
    if isinstance(want, int | float):
        if type(got) is torch.Tensor and got.numel() == 1:
            got = got.item()
        if not isinstance(got, int | float) or isinstance(got, bool):
            return f"returned {_kind(got)}, expected a number{at}"
        if not values:
            return ""
        if type(got) is int and type(want) is int:  # a count: exactly
            return "" if got == want else f"returned {got}, expected {want}{at}"
        if math.isclose(got, want, rel_tol=rtol, abs_tol=atol) or (got == want):
            return ""
        return f"returned {got:.6g}, expected {want:.6g}{at}"
    if isinstance(want, list | tuple | dict):
        if not isinstance(got, type(want) if isinstance(want, dict) else list | tuple):
            return f"returned {_kind(got)}, expected {_kind(want)}{at}"
        if len(got) != len(want) or (isinstance(want, dict) and set(got) != set(want)):
            return f"returned {_kind(got)}, expected {_kind(want)}{at}"
        keys = list(want) if isinstance(want, dict) else range(len(want))
        for k in keys:
            inner = f"{where}[{k!r}]" if where or isinstance(want, dict) else f"{k}"
            found = difference(got[k], want[k], atol, rtol, inner, values)
            if found:
                return found
        return ""
    if not values:
        return ""
    with contextlib.suppress(Exception):
        if bool(got == want):
            return ""
    return f"returned {_kind(got)}, expected {_kind(want)}{at}"


def _tensor_difference(
    got: Any, want: torch.Tensor, atol: float, rtol: float, at: str, values: bool
) -> str:
    if type(got) is not torch.Tensor:
        return f"returned {_kind(got)}, expected {_kind(want)}{at}"
    if want.is_floating_point() and torch.finfo(want.dtype).bits < 32:
        # (float16/bfloat16: two correct answers differ by their rounding, ~eps per step)
        eps = torch.finfo(want.dtype).eps
        atol, rtol = max(atol, 16 * eps), max(rtol, 16 * eps)
    if tuple(got.shape) != tuple(want.shape):
        return f"returned shape {tuple(got.shape)}, expected {tuple(want.shape)}{at}"
    if _dtype_kind(got) != _dtype_kind(want):
        return f"returned dtype {got.dtype}, expected {want.dtype}{at}"
    if not values:
        return ""
    if not want.is_floating_point():
        bad = got.cpu() != want.cpu()
        if not bool(bad.any()):
            return ""
        idx = tuple(int(i) for i in bad.nonzero()[0])
        return (
            f"differs from the expected value at index {idx} (you returned "
            f"{got[idx].item()}, expected {want[idx].item()}){at}"
        )
    g, w = got.detach().cpu().double(), want.detach().cpu().double()
    diff = (g - w).abs()
    diff = torch.where((g == w) | (g.isnan() & w.isnan()), torch.zeros_like(diff), diff)
    diff = torch.where(diff.isnan(), torch.full_like(diff, math.inf), diff)
    allowed = atol + rtol * w.abs()
    bad = diff > allowed
    if not bool(bad.any()):
        return ""
    idx = tuple(int(i) for i in (diff == diff.max()).nonzero()[0])
    return (
        f"differs from the expected value at index {idx} (you returned {float(g[idx]):.4g}, "
        f"expected {float(w[idx]):.4g}){at}"
    )


def _dtype_kind(t: torch.Tensor) -> str:
    if t.dtype == torch.bool:
        return "bool"
    if t.is_floating_point():
        return "float"
    return "complex" if t.is_complex() else "integer"


def _kind(value: Any) -> str:
    if type(value) is torch.Tensor:
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    if isinstance(value, list | tuple):
        return f"a {type(value).__name__} of {len(value)} items"
    return f"a {type(value).__name__}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _show(value: Any) -> str:
    if type(value) is torch.Tensor:
        return f"<{str(value.dtype).removeprefix('torch.')} tensor {tuple(value.shape)}>"
    if isinstance(value, list | tuple):
        inner = ", ".join(_show(v) for v in value[:6]) + (", ..." if len(value) > 6 else "")
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_show(v)}" for k, v in list(value.items())[:6]) + "}"
    return _short(value)


def _plain(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is data a drawn case can be made of (no model, function or object)."""
    if depth > 8:
        return False
    if type(value) is torch.Tensor:
        return value.layout == torch.strided and not value.is_complex()
    if isinstance(value, _CONSTANTS) or type(value) in (bool, int, float, str):
        return True
    if type(value) in (list, tuple):
        return all(_plain(v, depth + 1) for v in value)
    if type(value) is dict:
        return all(isinstance(k, str) and _plain(v, depth + 1) for k, v in value.items())
    return False


def _copy(value: Any) -> Any:
    if type(value) is torch.Tensor:
        return value.detach().clone()
    if type(value) in (list, tuple):
        return type(value)(_copy(v) for v in value)
    if type(value) is dict:
        return {k: _copy(v) for k, v in value.items()}
    return value


def _key(value: Any) -> Any:
    """A hashable stand-in for ``value``'s exact content (tensors by dtype, shape and bytes)."""
    if type(value) is torch.Tensor:
        t = value.detach().cpu().contiguous()
        flat = t.reshape(-1)  # (N,): its bytes, whatever its shape
        raw = flat.to(torch.uint8) if t.dtype == torch.bool else flat.view(torch.uint8)
        return ("tensor", str(t.dtype), tuple(t.shape), raw.numpy().tobytes())
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(_key(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _key(v)) for k, v in value.items()))
    if isinstance(value, float) and math.isnan(value):
        return ("nan",)
    return (type(value).__name__, value)


@dataclass
class _Draw:
    """One attempt at a drawn case: what it redraws (a rung of :data:`_LADDER`) and its
    random sources (integer sizes are all multiplied by one factor, so that their ratios,
    a width divisible by a number of heads, hold)."""

    how: frozenset[str]
    rng: torch.Generator
    shuffler: random.Random
    int_factor: int = 2
    float_factor: float = 1.5

    @classmethod
    def of(
        cls, how: frozenset[str], rng: torch.Generator, shuffler: random.Random, factor: int
    ) -> _Draw:
        return cls(how, rng, shuffler, factor, 1.25 + 0.5 * shuffler.random())

    def __call__(self, value: Any, top: bool = False) -> Any:
        """``value`` with what :attr:`how` names redrawn, its structure (shapes, dtypes) kept;
        a string's words are shuffled only where it is an argument itself (``top``: a text,
        not a token of a table)."""
        how = self.how
        if type(value) is torch.Tensor:
            return _mutate_tensor(value, how, self.rng)
        if type(value) is bool or isinstance(value, _CONSTANTS):
            return value
        if type(value) is int:
            return value * self.int_factor if "ints" in how and value > 0 else value
        if type(value) is float:
            return value * self.float_factor if "floats" in how and value > 0 else value
        if type(value) is str:
            words = value.split(" ")
            if "strings" not in how or not top or len(set(words)) < 2:
                return value
            self.shuffler.shuffle(words)  # the same words (what a word's answer rests on)
            return " ".join(words)
        if type(value) in (list, tuple):
            return type(value)(self(v) for v in value)
        if type(value) is dict:
            return {k: self(v) for k, v in value.items()}
        return value


def _mutate_tensor(t: torch.Tensor, how: frozenset[str], rng: torch.Generator) -> torch.Tensor:
    """Fresh values of ``t``'s shape and dtype, in the range its own values span."""
    if t.numel() == 0:
        return t.clone()
    if t.dtype == torch.bool or "tensors" not in how:  # (a mask's structure: kept)
        return t.clone()
    if t.is_floating_point():
        low, high = float(t.double().min()), float(t.double().max())
        if not (math.isfinite(low) and math.isfinite(high)) or low == high:
            return t.clone()
        fresh = low + (high - low) * torch.rand(t.shape, generator=rng, dtype=torch.float64)
        return fresh.to(t.dtype)
    low, high = int(t.min()), int(t.max())
    if low == high:
        return t.clone()
    return torch.randint(low, high + 1, t.shape, generator=rng).to(t.dtype)


def _run_kit(kit: Callable[..., Any], call: Call, seed: int) -> Any:
    """The kit's answer on ``call``'s inputs (copies), with torch's generator seeded, quietly."""
    args, kwargs = _copy(list(call.args)), _copy(call.kwargs)
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.manual_seed(seed)
        return _copy(kit(*args, **kwargs))


def _finite(value: Any) -> bool:
    if type(value) is torch.Tensor:
        return not value.is_floating_point() or bool(torch.isfinite(value).all())
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list | tuple):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True
