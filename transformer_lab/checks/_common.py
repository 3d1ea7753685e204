"""Helpers every lab's checks share: comparisons with actionable messages, safe calls, bans.

A check calls the student's function, compares what it returns with what is expected (a worked
example's stored values, a PyTorch reference, or an independent oracle in the hidden checks)
and, when something is off, raises ``AssertionError`` with a message that says what is wrong in
the student's terms ("row 3 of your encoding ... did you swap sin and cos?"). nbgrader shows
that message in the feedback, so it is the only explanation a student gets: it must name the
likely mistake, not just "mismatch".

The helpers here keep those messages uniform across labs:

* :func:`call_student` runs the student's function and turns its exceptions into
  ``AssertionError`` messages ("not implemented yet", "raised IndexError: ...").
* :func:`expect_shape` and :func:`expect_close` compare a result with what was expected
  and say where it differs, adding the caller's ``hint`` about the likely cause.
* :func:`compare` goes one step further for checks that know the typical wrong answers: it
  names the one the student's output reproduces (:func:`close` is its elementwise test).
* :func:`judge_cases` runs the student's function on every input of a check and, when some
  answer is wrong, names the typical mistakes whose outputs match the student's on EVERY input
  tried (one, unless two mistakes cannot be told apart there); when none does it says so and
  shows the smallest failing input, expected against got (:func:`diagnose` does the naming).
* :func:`call_forbidding` runs the student's function under a
  :class:`~transformer_lab.judge.bans.Ban` (what computes the answer: torch operation
  families such as softmax or normalisation, and Python functions such as the kit's
  implementation of an earlier lab), so a graded function that merely wraps them earns nothing.
* :func:`stored` reads the expected values of a visible check's worked example (and the
  outputs of the typical mistakes on it) from ``checks/fixtures/labNN.json``, which the
  instructor's build writes from the hidden checks' oracles: the student package needs no oracle.
* :func:`softmax_overflow_probe` traces a NaN in attention weights to its cause: it runs the
  student's attention on scores that are large but finite in the dtype, which a softmax
  without the max subtraction turns into NaN (labs 02 and 05).
* :func:`generator`, :func:`randint` and :func:`expect_module` are the small pieces the
  hidden checks share (seeded inputs that leave the notebook's RNG alone, built modules);
  :func:`load_weights` copies a case's named weights into a student's module (labs 04, 08).

Reference: nbgrader's autograding model (a test cell scores when it runs without raising),
https://nbgrader.readthedocs.io/en/stable/user_guide/creating_and_grading_assignments.html
"""

from __future__ import annotations

import functools
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch
from torch import Tensor, nn

from transformer_lab.graded import LockedAnswerError
from transformer_lab.judge import wire
from transformer_lab.judge.bans import Ban, ForbiddenCallError, forbidden
from transformer_lab.judge.oplog import OpLog

__all__ = [
    "EMPTY_ROW_NO_MAX",
    "FIXTURES",
    "NOT_TYPICAL",
    "NO_MAX_SUBTRACTION",
    "Ban",
    "Case",
    "CheckError",
    "ForbiddenCallError",
    "OpLog",
    "call_forbidding",
    "call_student",
    "close",
    "compare",
    "diagnose",
    "expect_close",
    "expect_module",
    "expect_shape",
    "expect_true",
    "forbidden",
    "generator",
    "judge_cases",
    "load_weights",
    "matching_mistakes",
    "named_mistakes",
    "note_mistake",
    "raised_on",
    "ran_on",
    "randint",
    "softmax_overflow_probe",
    "stored",
    "stored_data",
]

#: The audit event raised after every call of a student's function (see ``grading/guard.py``).
STUDENT_CALL_EVENT = "transformer_lab.student_call"

# A correct float32 answer differs from a float64 oracle by ~1e-6; every typical mistake by far
# more. The defaults of :func:`close` and :func:`compare`.
_ATOL = 1e-4
_RTOL = 1e-4


# --------------------------------------------------------------------------------------
# Calling the student's code
# --------------------------------------------------------------------------------------


def call_student(
    fn: Callable[..., Any],
    *args: Any,
    what: str = "your function",
    in_place: str | None = None,
    **kw: Any,
) -> Any:
    """Call ``fn(*args, **kw)`` and translate its failures into student-facing messages.

    The check's tensors among the arguments come back as they went in: a write the student's
    code makes into one (``x -= ...``) is undone after the call, so an expected value computed
    afterwards still comes from the check's inputs (a function that zeroes its inputs cannot
    make the oracle agree with it). Where a write is itself the mistake, ``in_place`` says so.

    Args:
        fn: the student's function (or class).
        *args: positional arguments for ``fn``.
        what: how to name the call in messages, e.g. ``"sinusoidal_encoding(4, 6)"``.
        in_place: if given, a write into an argument tensor (undone all the same) fails the
            call with the message ``f"{what} {in_place}"``; by default it is forgiven.
        **kw: keyword arguments for ``fn``.

    Returns:
        Whatever ``fn`` returns (a returned tensor that is a written argument, as returned).

    Raises:
        AssertionError: ``fn`` is not callable, still raises ``NotImplementedError``, raised
            any other exception (named, with its message), or wrote into an argument while
            ``in_place`` is given. Assertion errors, including those of :func:`forbidden`,
            pass through unchanged.
    """
    if not callable(fn):
        raise CheckError(f"{what}: expected a function, got {type(fn).__name__}.", "not a function")
    given = wire.plain_tensors([list(args), dict(kw)])
    before = [t.detach().clone() for t in given]
    try:
        result = fn(*args, **kw)
    except LockedAnswerError as exc:
        raise AssertionError(
            f"{what} needs something your installed kit does not hold yet: {exc}"
        ) from exc
    except NotImplementedError as exc:
        raise CheckError(
            f"{what} is not implemented yet: replace `raise NotImplementedError()` with your code.",
            "not implemented yet",
        ) from exc
    except AssertionError:
        raise
    except Exception as exc:
        raise CheckError(f"{what} raised {type(exc).__name__}: {exc}", "raised") from exc
    finally:
        # The grader's guard (if any) checks here that the student's code left the checks and
        # what they use as they were; without a guard this event goes nowhere.
        sys.audit(STUDENT_CALL_EVENT)
    written = [i for i, t in enumerate(given) if not wire.same_bits(t, before[i])]
    result = _undo_writes(result, [given[i] for i in written], [before[i] for i in written])
    if written and in_place is not None:
        raise AssertionError(f"{what} {in_place}")
    return result


def _undo_writes(result: Any, targets: list[Tensor], values: list[Tensor]) -> Any:
    """Put ``values`` back into the argument tensors ``targets``; a tensor of ``result`` that
    shares memory with one of them is copied first, so the student's answer stays as given."""
    if not targets:
        return result
    tensors, rebuild = wire.result_tensors(result)
    result = rebuild([t.clone() if any(_shares(t, x) for x in targets) else t for t in tensors])
    with torch.no_grad():
        for target, value in zip(targets, values, strict=True):
            if target.shape == value.shape and target.dtype == value.dtype:
                target.copy_(value)
            else:  # resized or retyped in place (``resize_``, ``set_``)
                target.data = value
    return result


def _shares(a: Tensor, b: Tensor) -> bool:
    """Whether ``a`` and ``b`` are views of one memory (a written input returned as is)."""
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() != 0


class CheckError(AssertionError):
    """A check's failure, with what kind of failure it is in a few fixed words.

    A hidden cell's message is made of these words alone (the judge's
    :func:`~transformer_lab.grading.judge.judge_cell`): the full text quotes what the answer
    returned (its shape, its values), which would let an answer read a hidden case back.
    """

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


# --------------------------------------------------------------------------------------
# Comparisons
# --------------------------------------------------------------------------------------


def _as_tensor(value: Any, what: str) -> Tensor:
    if isinstance(value, Tensor):
        return value
    got = "None (did you forget to `return` it?)" if value is None else type(value).__name__
    raise CheckError(f"{what} should be a torch.Tensor, got {got}.", "not a tensor")


def _fmt_shape(shape: Sequence[int | None]) -> str:
    return "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"


def ran_on(t: Tensor) -> str:
    """Where a result was computed, for failure messages: ``"(float32 on cpu)"``.

    A check that fails on a Colab GPU, an Apple Silicon laptop or a CPU unlike the instructor's
    says so, since rounding (not the student's code) can differ there.
    """
    return f"({str(t.dtype).removeprefix('torch.')} on {t.device})"


def expect_true(condition: bool, message: str) -> None:
    """Raise ``AssertionError(message)`` unless ``condition`` holds (a readable ``assert``).

    Plain ``assert`` statements vanish under ``python -O``; checks must not.
    """
    if not condition:
        raise AssertionError(message)


def expect_shape(t: Any, shape: Sequence[int | None], what: str) -> Tensor:
    """Check that ``t`` is a tensor of the given shape.

    Args:
        t: the value to check.
        shape: the expected shape; ``None`` entries match any size.
        what: how to name ``t`` in messages, e.g. ``"sinusoidal_encoding(4, 6)"``.

    Returns:
        ``t``, now known to be a tensor.

    Raises:
        AssertionError: ``t`` is not a tensor, or its shape differs; the message says when
            the dimensions are merely in the wrong order (a transpose) or one is missing.
    """
    t = _as_tensor(t, what)
    got = tuple(t.shape)
    want = tuple(shape)
    ok = len(got) == len(want) and all(w is None or g == w for g, w in zip(got, want, strict=False))
    if ok:
        return t
    msg = f"{what} has shape {_fmt_shape(got)}, expected {_fmt_shape(want)}"
    kind = "wrong shape"
    if None not in want and len(got) == len(want) and sorted(got) == sorted(want):
        msg += ": the sizes are right but in the wrong order. Did you transpose or swap two axes?"
        kind += " (the right sizes in the wrong order)"
    elif len(got) == len(want) - 1:
        msg += ": one dimension is missing. Did a sum, indexing or squeeze drop an axis?"
        kind += " (one dimension missing)"
    elif len(got) == len(want) + 1:
        msg += ": there is an extra dimension. Did you forget to squeeze or index an axis?"
        kind += " (one dimension too many)"
    else:
        msg += "."
    raise CheckError(msg, kind)


def expect_close(
    actual: Any,
    expected: Tensor,
    what: str,
    hint: str | None = None,
    atol: float = 1e-5,
    rtol: float = 1e-4,
) -> Tensor:
    """Check that ``actual`` matches ``expected`` in shape, dtype kind and values.

    Args:
        actual: the student's result.
        expected: the oracle's result.
        what: how to name ``actual`` in messages, e.g. ``"sinusoidal_encoding(8, 6)"``.
        hint: the likely mistake, appended to a value mismatch, e.g. ``"Did you swap sin and
            cos?"``. Checks that can tell mistakes apart pass a specific hint.
        atol: absolute tolerance.
        rtol: relative tolerance (of ``expected``).

    Returns:
        ``actual`` as a tensor.

    Raises:
        AssertionError: wrong type or shape, NaN/inf where the oracle is finite, an integer
            result where floats are expected, or values off by more than the tolerance; the
            message gives the largest difference, where it is, and ``hint``.
    """
    t = expect_shape(actual, tuple(expected.shape), what)
    if expected.is_floating_point() and not (t.is_floating_point() or t.is_complex()):
        raise CheckError(
            f"{what} has dtype {t.dtype}, expected a floating-point tensor ({expected.dtype}). "
            "Did integer arithmetic (e.g. torch.arange without dtype=torch.float32) creep in?",
            "wrong dtype (not floating point)",
        )
    got = t.detach().to("cpu", torch.float64)
    want = expected.detach().to("cpu", torch.float64)
    bad_finite = ~torch.isfinite(got) & torch.isfinite(want)
    if bool(bad_finite.any()):
        idx = tuple(int(i) for i in bad_finite.nonzero()[0])
        kind = "NaN" if math.isnan(float(got[idx])) else "inf"
        raise CheckError(
            f"{what} contains {kind} at index {idx} where {float(want[idx]):.4g} was expected "
            f"{ran_on(t)}. Look for a division by zero, an overflow or log of 0.",
            "not finite",
        )
    diff = (got - want).abs()
    diff = torch.where(torch.isnan(diff) & torch.isnan(want), torch.zeros_like(diff), diff)
    diff = torch.where(got == want, torch.zeros_like(diff), diff)  # equal infinities agree
    allowed = atol + rtol * want.abs()
    allowed = torch.where(torch.isinf(want), torch.zeros_like(allowed), allowed)  # inf: exactly
    if bool((diff <= allowed).all()):
        return t
    idx = tuple(int(i) for i in torch.nonzero(diff == diff.max())[0]) if diff.numel() else ()
    n_bad = int((diff > allowed).sum())
    msg = (
        f"{what} is wrong at {n_bad} of {diff.numel()} entries; the largest difference is "
        f"{float(diff.max()):.3g} at index {idx} (you returned {float(got[idx]):.4g}, "
        f"expected {float(want[idx]):.4g}) {ran_on(t)}."
    )
    if hint:
        msg += " " + hint
    raise CheckError(msg, "wrong values")


#: The typical mistakes the checks named since the last :func:`named_mistakes` (the grader's
#: judge reads them to say which catalogued mistake a failed cell made).
_NAMED: list[str] = []


def kernel_side(func: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a check's harness (a function of ``transformer_lab.checks``) that the judge runs in
    the student's kernel, beside the student's objects, and that returns only data.

    Used where the student's code must run inside a library's loop (Lightning's ``Trainer``):
    the facts it returns are then judged on the grader's side.
    """
    func.judge_kernel_side = True  # type: ignore[attr-defined]
    return func


def run_beside(anchor: Any, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``func(*args, **kwargs)`` where ``anchor`` (a student's object) lives.

    Locally that is here; for an object seen from the grader's judge it is the student's
    kernel (``func`` must be :func:`kernel_side`).
    """
    runner = getattr(type(anchor), "judge_run", None)
    return func(*args, **kwargs) if runner is None else runner(anchor, func, args, kwargs)


def instance_attributes(obj: Any) -> dict[str, Any]:
    """``vars(obj)``; for a student's module seen from the grader's judge, its module's own."""
    remote = getattr(type(obj), "judge_vars", None)
    return remote(obj) if remote is not None else vars(obj)


def note_mistake(hint: str) -> None:
    """Record that a check matched the typical mistake ``hint``."""
    _NAMED.append(hint)


def named_mistakes() -> list[str]:
    """The mistakes named since the last call (and forget them)."""
    found = list(_NAMED)
    _NAMED.clear()
    return found


def close(a: Tensor, b: Tensor, atol: float = _ATOL, rtol: float = _RTOL) -> bool:
    """True when ``a`` and ``b`` have one shape and agree elementwise in float64.

    NaNs never agree. Unlike ``torch.allclose``, tensors of different float dtypes compare.
    """
    return a.shape == b.shape and bool(
        torch.allclose(a.detach().double(), b.detach().double(), atol=atol, rtol=rtol)
    )


def _has_nan_like(got: Tensor, wrong: Tensor, atol: float, rtol: float) -> bool:
    """True when ``got`` has NaNs exactly where ``wrong`` has them and agrees elsewhere."""
    if got.shape != wrong.shape:
        return False
    nan_got, nan_wrong = torch.isnan(got), torch.isnan(wrong.double())
    if not bool((nan_got == nan_wrong).all()):
        return False
    keep = ~nan_got
    return bool(torch.allclose(got[keep], wrong.double()[keep], atol=atol, rtol=rtol))


def compare(
    actual: Any,
    expected: Tensor,
    *,
    what: str,
    candidates: Sequence[tuple[Tensor | None, str]] = (),
    hint: str,
    atol: float = _ATOL,
    rtol: float = _RTOL,
) -> Tensor:
    """Check ``actual`` against ``expected``; on failure name the typical mistake it matches.

    Args:
        actual: the student's result.
        expected: the oracle's result.
        what: how to name ``actual`` in messages.
        candidates: ``(output of a typical wrong answer, what to fix)`` pairs; ``None``
            outputs (a variant that does not apply to these sizes) are skipped. When
            ``actual`` has NaNs the oracle lacks, a candidate matches if it has NaNs in the
            same places and agrees elsewhere.
        hint: what to say when no candidate matches.
        atol: absolute tolerance.
        rtol: relative tolerance.

    Returns:
        ``actual`` as a tensor.

    Raises:
        AssertionError: as :func:`expect_close`, with the matched candidate's advice (or
            ``hint``) in the message, NaN and dtype failures included.
    """
    t = expect_shape(actual, tuple(expected.shape), what)
    if close(t, expected, atol=atol, rtol=rtol):
        return t
    got = t.detach().double()
    if bool(torch.isnan(got).any()) and not bool(torch.isnan(expected).any()):
        named = next(
            (h for w, h in candidates if w is not None and _has_nan_like(got, w, atol, rtol)),
            None,
        )
    else:
        named = next(
            (h for w, h in candidates if w is not None and close(got, w, atol=atol, rtol=rtol)),
            None,
        )
    advice = named or hint
    if named:
        note_mistake(named)
    try:
        expect_close(t, expected, what, hint=advice, atol=atol, rtol=rtol)
    except AssertionError as exc:
        # expect_close words NaN/inf and dtype failures itself; keep the advice in the message.
        message = str(exc)
        if advice not in message:
            message += " " + advice
        raise CheckError(message, getattr(exc, "kind", "wrong values")) from None
    return t


# --------------------------------------------------------------------------------------
# One diagnosis over every input a check tried
# --------------------------------------------------------------------------------------

I = TypeVar("I")

#: What a failure message says when no catalogued mistake reproduces the student's outputs.
NOT_TYPICAL = "This is not one of the typical mistakes the check knows."


@dataclass
class Case(Generic[I]):
    """One input a check tried: the student's output there, the expected one, the mistakes'.

    Attributes:
        input: what the check passed (for the message; any value).
        what: the call as the student would write it, e.g. ``"top_p_filter(logits, p=0.5)"``.
        got: the student's output.
        want: the expected output.
        mistakes: hint -> what that typical mistake returns on this input. A hint missing here
            returns ``want`` (stored examples keep only the mistakes that differ); ``None``
            means the mistake does not apply to this input (it matches nothing).
        size: how large the input is; the smallest failing input is the one shown.
        decides: False for an input tried only to tell mistakes apart once another failed
            (a wrong answer there is no failure of its own, and is never the one shown).
    """

    input: I
    what: str
    got: Any
    want: Any
    mistakes: Mapping[str, Any]
    size: float = 0.0
    decides: bool = True


def matching_mistakes(cases: Sequence[Case[Any]], same: Callable[[Any, Any], bool]) -> list[str]:
    """The hints of the mistakes whose outputs equal the student's on EVERY case, in order.

    A mistake that gives the right answer on an input the student also got right matches
    there; one that is right where the student is wrong (or wrong where the student is right)
    does not.
    """
    hints = list(dict.fromkeys(h for case in cases for h in case.mistakes))
    found = []
    for hint in hints:
        outputs = [case.mistakes.get(hint, case.want) for case in cases]
        if all(
            out is not None and same(case.got, out)
            for case, out in zip(cases, outputs, strict=True)
        ):
            found.append(hint)
    return found


def diagnose(
    cases: Sequence[Case[Any]],
    *,
    same: Callable[[Any, Any], bool],
    describe: Callable[[Case[Any]], str],
    rule: str | Callable[[Case[Any]], str],
    named: Callable[[Case[Any]], str | None] | None = None,
) -> None:
    """Raise one diagnosis for the cases a check tried, or nothing when every answer is right.

    The message shows the smallest failing case (``describe``: the call, what it returned and
    what was expected) and then, in this order:

    * the typical mistake whose outputs match the student's on every case
      (:func:`matching_mistakes`), recorded with :func:`note_mistake`. Only when several give
      the same outputs on every case are they all listed, joined by " Or: " (a catalogue
      should hold inputs that tell its mistakes apart);
    * else the mistake ``named`` recognises in every failing case by its shape (ties dropped,
      ``0`` instead of ``-inf``, ...), if it recognises the same one in each;
    * else :data:`NOT_TYPICAL` and the ``rule`` the answer must follow.

    Args:
        cases: every input tried, right and wrong, in the order tried.
        same: whether two outputs are the same answer.
        describe: the failing case in the student's terms, ending with a full stop.
        rule: what a right answer does (or a function of the case shown that says it).
        named: a mistake recognised from one failing case alone (or ``None``).
    """
    failing = [case for case in cases if case.decides and not same(case.got, case.want)]
    if not failing:
        return
    shown = min(failing, key=lambda case: case.size)  # the first of the smallest
    hints = matching_mistakes(cases, same)
    if hints:
        note_mistake(hints[0])
        raise AssertionError(f"{describe(shown)} {' Or: '.join(hints)}")
    if named is not None:
        seen = {named(case) for case in failing}
        if len(seen) == 1 and None not in seen:
            hint = next(iter(seen)) or ""
            note_mistake(hint)
            raise AssertionError(f"{describe(shown)} {hint}")
    advice = rule(shown) if callable(rule) else rule
    raise AssertionError(f"{describe(shown)} {NOT_TYPICAL} {advice}")


def raised_on(exc: AssertionError, kind: str) -> AssertionError:
    """``exc`` (a check's failure), saying which kind of input the student's code raised on
    when it raised: the check's words, which a hidden check shows where it hides the error's
    own text (kept as ``exc.input_kind`` too)."""
    if kind and " raised " in str(exc) and not getattr(exc, "input_kind", None):
        exc.input_kind = kind  # type: ignore[attr-defined]
        text = str(exc).rstrip()
        end = " " if text.endswith((".", ")")) else ". "
        exc.args = (f"{text}{end}It raised on {kind}.", *exc.args[1:])
    return exc


def judge_cases(
    inputs: Sequence[I],
    run: Callable[[I], Any],
    expected: Callable[[I], Any],
    mistakes: Callable[[I], Mapping[str, Any]],
    *,
    same: Callable[[Any, Any], bool],
    what: Callable[[I], str],
    describe: Callable[[Case[I]], str],
    rule: str | Callable[[Case[I]], str],
    size: Callable[[I], float] | None = None,
    named: Callable[[Case[I]], str | None] | None = None,
    screen: Callable[[Case[I]], None] | None = None,
    tell_apart: Sequence[I] = (),
    input_kind: Callable[[I], str] | None = None,
) -> None:
    """Run the student's code on every input, then :func:`diagnose` what it got wrong.

    The inputs are tried in order. A wrong answer does not stop the run: the remaining inputs
    are tried too, so that the diagnosis rests on all of them (the typical mistakes are run on
    the same inputs, only once something is wrong). The student's code raising (an
    ``AssertionError`` from :func:`call_student` and friends) stops the run: before any wrong
    answer that message is the verdict; after one, the diagnosis uses the inputs tried so far.

    Args:
        inputs: the check's inputs.
        run: the student's output on an input (the call, under its ban).
        expected: the right output on an input.
        mistakes: hint -> each typical mistake's output on an input (see :class:`Case`).
        same: whether two outputs are the same answer.
        what: the call on an input, as the student would write it.
        describe: see :func:`diagnose`.
        rule: see :func:`diagnose`.
        size: how large an input is (default: its position, so the first failing one shows).
        named: see :func:`diagnose`.
        screen: looks at every wrong answer as it comes and raises at once for a problem that
            is no typical mistake of the values (a hypothesis without BOS, a wrong length).
        tell_apart: inputs tried only once an answer is wrong, to tell apart mistakes that
            agree on every input (their :class:`Case` ``decides`` nothing; one that raises is
            left out).
        input_kind: what sets an input apart, in the check's own words ("k above the
            vocabulary size"): the student's code raising there says so (:func:`raised_on`).
    """
    tried: list[tuple[I, Any, Any]] = []
    wrong = False
    for item in inputs:
        try:
            got = run(item)
        except AssertionError as exc:
            if not wrong:
                raise raised_on(exc, input_kind(item) if input_kind else "") from exc.__cause__
            break
        want = expected(item)
        if not same(got, want):
            wrong = True
            if screen is not None:
                screen(Case(item, what(item), got, want, {}, 0.0))
        tried.append((item, got, want))
    if not wrong:
        return
    cases = [
        Case(item, what(item), got, want, mistakes(item), size(item) if size else float(i))
        for i, (item, got, want) in enumerate(tried)
    ]
    for item in tell_apart:
        try:
            got = run(item)
        except AssertionError:
            continue
        cases.append(Case(item, what(item), got, expected(item), mistakes(item), decides=False))
    diagnose(cases, same=same, describe=describe, rule=rule, named=named)


#: The mistake :func:`softmax_overflow_probe` finds.
NO_MAX_SUBTRACTION = (
    "Your softmax overflows: subtract each row's maximum before exponentiating, "
    "exp(x - x.amax(-1, keepdim=True)), so that no exp exceeds 1."
)
#: Why a row the mask empties comes out NaN from such a softmax.
EMPTY_ROW_NO_MAX = (
    "In a row the mask empties every score is finfo.min: exp of it is 0 for every key, the sum "
    "is 0 and 0/0 is NaN; after subtracting the maximum the row is exp(0) = 1 everywhere, and "
    "zeroing the masked weights after the softmax makes it 0."
)

#: Scores whose exp overflows in each dtype while the dtype holds them (float16: exp(16) >
#: 65504; float32 and bfloat16: exp(100) > 3.4e38; float64: exp(800) > 1.8e308).
_OVERFLOWING_SCORE = {torch.float16: 16.0, torch.bfloat16: 100.0, torch.float32: 100.0}


def softmax_overflow_probe(
    weights_of: Callable[[Tensor, Tensor, Tensor, Tensor | None], Any],
    q: Tensor,
    v: Tensor,
    *,
    masked: bool,
) -> str | None:
    """What a probe shows when the student's softmax lacks the max subtraction, else None.

    The probe: two queries and two keys in the dtype (and leading axes) of ``q`` whose scores,
    ``q . k / sqrt(d_k)``, are large but finite there (16 and 8 in float16, 100 and 50 in
    float32), every key allowed. A softmax that subtracts the row maximum gives finite weights;
    one that does not computes exp(16) = inf in float16 and inf / inf = NaN. A probe the
    student's code cannot run tells nothing (None).

    Args:
        weights_of: runs the student's attention on ``(q, k, v, mask or None)`` (under its
            ban) and returns the weights.
        q: the queries of the failing call (for the dtype, ``d_k`` and the leading axes).
        v: its values (for ``d_v`` and their leading axes).
        masked: whether the attention takes a mask (then an all-True one is passed).

    Returns:
        The sentence that says what the probe showed, or None when its weights are finite.
    """
    dtype = q.dtype
    big = _OVERFLOWING_SCORE.get(dtype, 800.0)
    d, lead = q.shape[-1], tuple(q.shape[:-2])
    side = math.sqrt(big * math.sqrt(d))  # q . k / sqrt(d) = big where both hold `side`
    pq = torch.zeros(*lead, 2, d, dtype=torch.float64)  # (..., 2, d_k)
    pq[..., 0] = side
    pk = pq.clone()
    pk[..., 1, 0] = side / 2  # the second key scores big / 2
    pv = torch.zeros(*v.shape[:-2], 2, v.shape[-1], dtype=torch.float64)  # (..., 2, d_v)
    pq, pk, pv = (t.to(dtype) for t in (pq, pk, pv))
    pmask = torch.ones(*lead, 2, 2, dtype=torch.bool) if masked else None
    try:
        weights = weights_of(pq, pk, pv, pmask)
        # The control: the same probe with scores of 1 and 1/2. Not finite there either, the
        # NaN is no overflow (an inverted mask empties the probe's rows): the probe tells nothing.
        control = weights_of(pq / math.sqrt(big), pk / math.sqrt(big), pv, pmask)
    except AssertionError:
        return None
    if not isinstance(weights, Tensor) or bool(torch.isfinite(weights.detach()).all()):
        return None
    if not isinstance(control, Tensor) or not bool(torch.isfinite(control.detach()).all()):
        return None
    name = str(dtype).removeprefix("torch.")
    return (
        f"With scores of {big:g} and {big / 2:g} (finite in {name}, every key allowed) your "
        "weights are not finite either, while a softmax that subtracts the row maximum gives "
        f"finite ones: exp({big:g}) overflows {name} (its largest number is "
        f"{torch.finfo(dtype).max:.4g}) and inf / inf is NaN."
    )


def expect_module(obj: Any, what: str) -> nn.Module:
    """Check that a student's class built an ``nn.Module``; return it.

    Raises:
        AssertionError: ``obj`` is not a module (a class that forgot to inherit from it).
    """
    if not isinstance(obj, nn.Module):
        raise CheckError(
            f"{what} should build an nn.Module, got {type(obj).__name__}: does your class "
            "inherit from nn.Module and call super().__init__()?",
            "not an nn.Module",
        )
    return obj


def load_weights(
    module: nn.Module,
    weights: Mapping[str, Tensor],
    what: str,
    layout: str = "the attribute names of the notebook",
) -> None:
    """Copy ``weights`` (named as in the kit's layout) into the module's existing Parameters,
    so that a check runs the student's module on a case's stored or drawn weights.

    ``self_attn.q_proj/k_proj/v_proj`` go to the rows of ``in_proj_weight``/``in_proj_bias``
    where ``self_attn`` is an ``nn.MultiheadAttention``.

    Raises:
        AssertionError: a parameter is missing (the message says to use ``layout``) or has
            the wrong shape.
    """
    params = dict(module.named_parameters())
    with torch.no_grad():
        for name, value in weights.items():
            target, rows = params.get(name), slice(None)
            if target is None and any(f".{p}." in name for p in ("q_proj", "k_proj", "v_proj")):
                prefix, proj, kind = name.rsplit(".", 2)
                target = params.get(f"{prefix}.in_proj_{kind}")
                d = value.shape[0]
                start = {"q_proj": 0, "k_proj": d, "v_proj": 2 * d}[proj]
                rows = slice(start, start + d)
            if target is None:
                raise AssertionError(f"{what} has no parameter `{name}`: use {layout}.")
            if tuple(target[rows].shape) != tuple(value.shape):
                raise AssertionError(
                    f"`{name}` of {what} has shape {tuple(target[rows].shape)}, expected "
                    f"{tuple(value.shape)}: use {layout}."
                )
            target[rows].copy_(value)


# --------------------------------------------------------------------------------------
# Seeded inputs
# --------------------------------------------------------------------------------------


def generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed`` (hidden checks draw from it, not the global RNG)."""
    return torch.Generator().manual_seed(seed)


def randint(low: int, high: int, g: torch.Generator) -> int:
    """A random integer in ``[low, high]`` (both ends included)."""
    return int(torch.randint(low, high + 1, (1,), generator=g))


def call_forbidding(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: dict[str, Any],
    *,
    ban: Ban,
    what: str,
    on_error: str = "",
    in_place: str | None = None,
) -> Any:
    """:func:`call_student` ``fn(*args, **kwargs)`` with ``ban`` enforced.

    Args:
        fn: the student's function or class.
        args: its positional arguments.
        kwargs: its keyword arguments.
        ban: what the call may not use (:class:`~transformer_lab.judge.bans.Ban`).
        what: how to name the call in messages.
        on_error: appended to the message when the student's code raises an exception.
        in_place: what a write into an argument tensor fails with (:func:`call_student`).

    Returns:
        Whatever ``fn`` returns.
    """
    try:
        with forbidden(ban):
            return call_student(fn, *args, what=what, in_place=in_place, **kwargs)
    except AssertionError as exc:
        if on_error and f"{what} raised " in str(exc):
            raise CheckError(f"{exc} {on_error}", getattr(exc, "kind", "raised")) from exc
        raise


# --------------------------------------------------------------------------------------
# Stored worked examples
# --------------------------------------------------------------------------------------

#: Folder of the visible checks' stored examples (``labNN.json``), written by ``labs build``.
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@functools.cache
def _fixture_file(lab: str) -> dict[str, Any]:
    path = FIXTURES / f"{lab}.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AssertionError(
            f"the kit's stored examples {path.name} are missing: reinstall the kit"
        ) from None


def stored(lab: str, key: str) -> tuple[Tensor, dict[str, Tensor]]:
    """A visible check's worked example: expected value and the typical mistakes' outputs.

    Args:
        lab: ``"lab01"``...
        key: the example's name, the call as a student would write it
            (``"sinusoidal_encoding(5, 4)"``).

    Returns:
        ``(expected, {hint: what that mistake returns})``, float64 tensors.

    Raises:
        KeyError: no such example (a bug in the checks: ``labs build`` writes them all).
    """
    expected, mistakes = stored_data(lab, key)
    as_tensor = functools.partial(torch.tensor, dtype=torch.float64)
    return as_tensor(expected), {hint: as_tensor(value) for hint, value in mistakes.items()}


def stored_data(lab: str, key: str) -> tuple[Any, dict[str, Any]]:
    """:func:`stored` as the JSON holds it: ``(expected, {hint: output})``, nested lists and
    numbers, for examples that are not one tensor (token ids, beams, tables)."""
    entry = _fixture_file(lab)[key]
    return entry["expected"], entry.get("mistakes", {})
