"""Checks generated from a part's declaration: the visible and hidden checks of ordinary parts.

An *ordinary* part is one whose check is: call the student's answer on a list of cases, compare
each output with the oracle's (at the tolerance of the lab's spec), and when something is wrong
name the one catalogued mistake whose outputs match the student's on every case
(:func:`~transformer_lab.checks._common.judge_cases`). All of that but a few functions is the
same for every such part, so it is written once here. A lab declares:

* in its visible module (the student package: no oracle), an :class:`Ordinary` per part: how
  the answer is called on one case (under the part's ban, its output made plain: a list of
  ints, a tensor), how the call reads in a message, how a wrong output is described and the rule
  a right one follows, and the comparison (``same``); ``load`` turns a case stored as JSON data
  back into the call's arguments, ``output`` an output stored as JSON back into what ``same``
  compares. Its visible checks are then one line each (:meth:`Ordinary.visible`);
* in its hidden module, an :class:`Oracle` per part: the oracle and the typical mistakes'
  outputs, plain Python functions of the case's arguments. Its hidden checks run the answer on
  drawn cases (:meth:`Oracle.hidden`: a function of a seeded generator gives them) or on any
  list of cases (:meth:`Oracle.judge`, for a check that also asserts something bespoke), and
  its ``fixtures()`` stores each visible check's worked examples (:meth:`Oracle.fixtures`).

A visible check's worked examples are data: ``fixtures/labNN.json`` holds, for the check
``check_x``, the cases as the check passes them (``"check_x: cases"``) and, for each, the
expected output and the outputs of the mistakes that differ from it (``"check_x 0"``, ...).
Bespoke code stays where a part needs it: an answer with state (a tokenizer fitted first), an
assertion that is no comparison of outputs (a ``ValueError`` for a bad argument), stand-ins the
answer is given (a search's step function: ``load`` builds it from stored data).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch
from torch import Tensor

from transformer_lab.checks._common import (
    Case,
    close,
    expect_close,
    expect_shape,
    expect_true,
    generator,
    judge_cases,
    stored_data,
)
from transformer_lab.checks.spec import all_specs

__all__ = [
    "Given",
    "Oracle",
    "Ordinary",
    "as_list",
    "floats_at",
    "plain",
    "tensors",
    "token_ids",
]


class Given(NamedTuple):
    """One case of a check: the arguments the answer is called with (after its own first
    argument, the answer) and, for a stored worked example, ``(expected, {hint: output})``."""

    args: tuple[Any, ...]
    stored: tuple[Any, Mapping[str, Any]] | None = None


def plain(value: Any) -> Any:
    """``value`` as JSON data: tensors as nested lists, tuples as lists (recursively)."""
    if isinstance(value, Tensor):
        return value.tolist()
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    return value


def tensors(*case: Any) -> tuple[Any, ...]:
    """A case stored by :func:`plain`, back (an :class:`Ordinary`'s ``load`` for parts that
    take tensors): lists as float32, int64 (token ids) or bool tensors, dicts of them, anything
    else as is."""
    loaded = []
    for value in case:
        if isinstance(value, dict):
            value = dict(zip(value, tensors(*value.values()), strict=True))
        elif isinstance(value, list):
            value = torch.tensor(value)  # JSON keeps 1.0 apart from 1: the dtype is the stored one
        loaded.append(value)
    return tuple(loaded)


def floats_at(atol: float, rtol: float = 1e-4) -> dict[str, Callable[..., Any]]:
    """An :class:`Ordinary`'s ``load``, ``output``, ``same`` and ``describe`` for a part whose
    output is a float tensor: cases stored by :func:`plain`, outputs compared in float64 at
    ``atol``/``rtol``, a wrong one described by ``expect_close`` (where, and by how much)."""

    def describe(case: Case[Any]) -> str:
        try:
            expect_close(case.got, case.want, case.what, atol=atol, rtol=rtol)
        except AssertionError as exc:
            return str(exc)
        return f"{case.what} is within the tolerance."  # never shown: the case failed

    return {
        "load": tensors,
        "output": lambda out: torch.as_tensor(out, dtype=torch.float64),
        "same": lambda got, want: close(got, want, atol=atol, rtol=rtol),
        "describe": describe,
    }


def as_list(got: Any, what: str, item: type | tuple[type, ...], should: str) -> list[Any]:
    """An answer that should be a list of ``item`` values (a tuple, or a tensor's ``tolist()``,
    does too), as a list: what a ``call`` of an :class:`Ordinary` returns for answers such as
    token ids or pieces. A bool is no int.

    Raises:
        AssertionError: ``"{what} returned {got}; it should return {should}."``
    """
    if isinstance(got, Tensor):
        got = got.tolist()
    if not isinstance(got, list | tuple) or not all(
        isinstance(i, item) and not isinstance(i, bool) for i in got
    ):
        raise AssertionError(f"{what} returned {got!r:.120}; it should return {should}.")
    return list(got)


def token_ids(got: Any, shape: Sequence[int | None], what: str, fix: str) -> Tensor:
    """``got`` as token ids: an integer tensor of ``shape`` (``None``: any size there).

    Raises:
        AssertionError: a wrong shape, or ``"{what} has dtype ...: token ids are integers. {fix}"``.
    """
    got = expect_shape(got, shape, what)
    expect_true(
        not got.is_floating_point(), f"{what} has dtype {got.dtype}: token ids are integers. {fix}"
    )
    return got


def returned(case: Case[Given]) -> str:
    """A wrong case as most parts describe it: the call, what it returned, what was expected
    (each cut at 300 characters)."""
    return f"{case.what} returned {case.got!r:.300}, expected {case.want!r:.300}."


def _as_is(value: Any) -> Any:
    return value


def _args(*args: Any) -> tuple[Any, ...]:
    return args


def _named(func: Callable[..., None], name: str, doc: str) -> Callable[..., None]:
    """``func`` under the check's own name and docstring (what tracebacks and the guard show)."""
    func.__name__ = func.__qualname__ = name
    func.__doc__ = doc
    return func


@dataclass(frozen=True)
class Ordinary:
    """How one ordinary part's answer is called and judged (the visible side: no oracle).

    Attributes:
        lab: the lab's checks module name (``"lab07"``): where its worked examples are stored.
        call: ``call(answer, *args)`` -> the answer's output on one case, made plain, under the
            part's ban; raises ``AssertionError`` for an output of the wrong kind.
        what: ``what(*args)`` -> the call as the student would write it.
        rule: what a right answer does (or a function of the case shown that says it).
        describe: a failing :class:`~transformer_lab.checks._common.Case` in the student's
            terms (``case.input`` is the :class:`Given`), ending with a full stop (by default
            :func:`returned`).
        same: whether two outputs are the same answer (at the spec's tolerance for floats).
        size: ``size(*args)``: how large a case is (the smallest failing one is shown).
        named, screen: see :func:`~transformer_lab.checks._common.judge_cases`.
        input_kind: ``input_kind(*args)``: what sets a case apart, said when the answer raised.
        load: ``load(*stored)`` -> the call's arguments, from a case stored as JSON data.
        output: an output (stored as JSON data, or the oracle's) -> what ``same`` compares.
    """

    lab: str
    call: Callable[..., Any]
    what: Callable[..., str]
    rule: str | Callable[[Case[Given]], str]
    describe: Callable[[Case[Given]], str] = returned
    same: Callable[[Any, Any], bool] = operator.eq
    size: Callable[..., float] | None = None
    named: Callable[[Case[Given]], str | None] | None = None
    screen: Callable[[Case[Given]], None] | None = None
    input_kind: Callable[..., str] | None = None
    load: Callable[..., tuple[Any, ...]] = _args
    output: Callable[[Any], Any] = _as_is

    def judge(
        self,
        answer: Any,
        cases: Sequence[Given],
        oracle: Callable[..., Any] | None = None,
        mistakes: Callable[..., Mapping[str, Any]] | None = None,
        tell_apart: Sequence[Given] = (),
    ) -> None:
        """Run ``answer`` on every case and give one diagnosis for them all.

        A stored case brings its expected output and mistakes' outputs; any other is compared
        with ``oracle(*args)`` and named with ``mistakes(*args)`` (hint -> output, ``None``
        where a mistake does not apply). ``tell_apart``: cases run only to tell mistakes apart.
        """

        if oracle is None and any(given.stored is None for given in (*cases, *tell_apart)):
            raise ValueError("a case without stored outputs is judged against an oracle: pass it")

        def expected(given: Given) -> Any:
            return self.output(given.stored[0] if given.stored else oracle(*given.args))

        def outputs(given: Given) -> dict[str, Any]:
            found = given.stored[1] if given.stored else mistakes(*given.args) if mistakes else {}
            return {hint: None if out is None else self.output(out) for hint, out in found.items()}

        def by_args(func: Callable[..., Any] | None) -> Callable[[Given], Any] | None:
            return None if func is None else lambda given: func(*given.args)

        judge_cases(
            cases,
            lambda given: self.call(answer, *given.args),
            expected,
            outputs,
            same=self.same,
            what=lambda given: self.what(*given.args),
            describe=self.describe,
            rule=self.rule,
            size=by_args(self.size),
            named=self.named,
            screen=self.screen,
            tell_apart=tell_apart,
            input_kind=by_args(self.input_kind),
        )

    def examples(self, check: str) -> list[Given]:
        """The worked examples of the visible check ``check``, as stored by ``labs build``."""
        cases, _ = stored_data(self.lab, f"{check}: cases")
        return [
            Given(self.load(*case), stored_data(self.lab, f"{check} {i}"))
            for i, case in enumerate(cases)
        ]

    def visible(self, check: str, doc: str) -> Callable[[Any], None]:
        """The visible check ``check``: the answer on its stored worked examples."""

        def run(answer: Any) -> None:
            self.judge(answer, self.examples(check))

        return _named(run, check, doc)


@dataclass(frozen=True)
class Oracle:
    """An ordinary part's oracle and typical mistakes (the hidden side).

    Attributes:
        part: the part's :class:`Ordinary`.
        oracle: ``oracle(*args)`` -> the right output.
        mistakes: ``mistakes(*args)`` -> {hint: that mistake's output}, in the catalogue's order
            (the first match is the one named).
    """

    part: Ordinary
    oracle: Callable[..., Any]
    mistakes: Callable[..., Mapping[str, Any]]

    @classmethod
    def of(
        cls,
        part: Ordinary,
        name: str,
        oracle: Callable[..., Any],
        *extra: tuple[str, dict[str, Any]],
    ) -> Oracle:
        """``oracle`` and, as its mistakes, each mistake of the lab spec's part ``name`` whose
        record gives options of ``oracle``, in the spec's order, then the ``extra`` (hint,
        options): {hint: ``oracle(*args, **options)``}."""
        specs = {f"lab{s.lab[:2]}": s for s in all_specs()}
        if part.lab not in specs or name not in specs[part.lab].parts:
            raise ValueError(f"no spec part {name!r} of {part.lab!r} to name mistakes from")
        named = [*specs[part.lab].parts[name].options_for(oracle), *extra]
        return cls(part, oracle, lambda *a: {h: oracle(*a, **kw) for h, kw in named})

    def at(self, **changes: Any) -> Oracle:
        """The same oracle and mistakes for the part with ``changes`` (another ``same``, a fixed
        ``named``...): a trial of the part at another tolerance, or naming one mistake."""
        return replace(self, part=replace(self.part, **changes))

    def judge(
        self, answer: Any, cases: Sequence[tuple[Any, ...]], tell_apart: Sequence[Any] = ()
    ) -> None:
        """Run ``answer`` on the cases (argument tuples) against the oracle: one diagnosis."""
        self.part.judge(
            answer,
            [Given(tuple(args)) for args in cases],
            self.oracle,
            self.mistakes,
            [Given(tuple(args)) for args in tell_apart],
        )

    def hidden(
        self, check: str, draw: Callable[[torch.Generator], list[tuple[Any, ...]]], doc: str
    ) -> Callable[..., None]:
        """The hidden check ``check(answer, seed=0)``: the answer on the cases ``draw`` makes
        from a generator seeded with ``seed``."""

        def run(answer: Any, seed: int = 0) -> None:
            self.judge(answer, draw(generator(seed)))

        return _named(run, check, doc)

    def fixtures(self, check: str, cases: Sequence[Sequence[Any]]) -> dict[str, dict[str, Any]]:
        """The stored worked examples of the visible check ``check``: the cases as JSON data
        (what :meth:`Ordinary.examples` reads back), each one's expected output and the outputs
        of the mistakes that differ from it there (one left out gives the expected output)."""
        stored = [plain(case) for case in cases]
        out = {f"{check}: cases": {"expected": stored, "mistakes": {}}}
        for i, case in enumerate(stored):
            args = self.part.load(*case)
            want = self.oracle(*args)
            differing = {
                hint: plain(got)
                for hint, got in self.mistakes(*args).items()
                if got is None or not self.part.same(self.part.output(got), self.part.output(want))
            }
            out[f"{check} {i}"] = {"expected": plain(want), "mistakes": differing}
        return out
