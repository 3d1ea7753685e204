"""Visible checks of lab 01 (positional encoding): sinusoidal_encoding, relative_shift_matrix.

They run the student's function on worked examples stored in ``fixtures/lab01.json`` (written
from the hidden checks' oracle) with the tables the typical mistakes produce there, so that a
wrong answer is named. While it runs, the kit's positional module is refused (:data:`BAN`).

Reference: Vaswani et al., "Attention Is All You Need", NeurIPS 2017, section 3.5; the course's
conventions in ``docs/curriculum.md`` (positions from 0, ``PE[p + k] == PE[p] @ M(k)``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from transformer_lab.checks import spec
from transformer_lab.checks._common import (
    call_forbidding,
    close,
    compare,
    expect_close,
    expect_shape,
    expect_true,
    stored,
)

__all__ = [
    "check_relative_shift_matrix",
    "check_relative_shift_matrix_shape",
    "check_sinusoidal_encoding",
    "check_sinusoidal_encoding_shape",
]

#: The lab's spec (``specs/lab01.toml``): its bans and shared tolerances.
SPEC = spec.load("01_positional_encoding")
BAN = SPEC.ban("positional")
_TOL = SPEC.tol("float32")


#: What a right table and a right matrix follow (said when no typical mistake matches).
ENCODING_RULE = "PE[p, 2i] = sin(p / base**(2i/d)) and PE[p, 2i+1] = cos(p / base**(2i/d))."
SHIFT_RULE = "PE[p] @ M should equal PE[p + offset] for every position p."


def call(name: str, a: float, d_model: int, base: float = 10000.0) -> str:
    """The call as the student writes it: ``sinusoidal_encoding(5, 4, base=100)``."""
    return f"{name}({a}, {d_model}{f', base={base:g}' * (base != 10000.0)})"


def run(name: str, fn: Callable[..., Tensor], a: int, d_model: int, base: float = 1e4) -> Tensor:
    """The student's ``name(a, d_model[, base])`` (the part ``name``) under the lab's ban."""
    kwargs = {} if base == 10000.0 else {"base": base}
    return call_forbidding(fn, (a, d_model), kwargs, ban=BAN, what=call(name, a, d_model, base))


#: The student's ``sinusoidal_encoding(seq_len, ...)`` and ``relative_shift_matrix(offset, ...)``.
encode = functools.partial(run, "sinusoidal_encoding")
shift = functools.partial(run, "relative_shift_matrix")


def judge(
    got: object,
    want: Tensor,
    mistakes: Mapping[str, Tensor],
    what: str,
    rule: str,
    **tolerance: float,
) -> Tensor:
    """Compare a student's table or matrix with ``want`` (float64); name the mistake it
    reproduces (``mistakes``: hint -> its output), else say the ``rule``. Returns ``got``."""
    candidates = [(wrong, hint) for hint, wrong in mistakes.items()]
    tolerance = {"atol": _TOL, "rtol": _TOL, **tolerance}
    return compare(got, want, what=what, candidates=candidates, hint=rule, **tolerance)


def check_sinusoidal_encoding_shape(fn: Callable[..., Tensor]) -> None:
    """Shape, dtype and the first row of ``fn(4, 6)``: position 0 is ``[0, 1, 0, 1, 0, 1]``."""
    what = "sinusoidal_encoding(4, 6)"
    got = expect_shape(encode(fn, 4, 6), (4, 6), what)
    expect_true(
        got.is_floating_point(),
        f"{what} has dtype {got.dtype}; the encoding is real-valued. Use a float tensor "
        "(e.g. torch.arange(..., dtype=torch.float32)).",
    )
    if not close(got[0], torch.tensor([0.0, 1.0] * 3), atol=_TOL):
        hint = "Position 0 has every angle 0, so sin columns are 0 and cos columns are 1."
        judge(got, *stored("lab01", what), what, hint)
    # A second size, so that a table that ignores its arguments does not pass.
    expect_shape(encode(fn, 3, 2), (3, 2), "sinusoidal_encoding(3, 2)")


def check_sinusoidal_encoding(fn: Callable[..., Tensor]) -> None:
    """Worked examples ``fn(5, 4)``, ``fn(6, 8)``, ``fn(3, 4, base=100.0)``."""
    for seq_len, d_model, base in ((5, 4, 10000.0), (6, 8, 10000.0), (3, 4, 100.0)):
        what = call("sinusoidal_encoding", seq_len, d_model, base)
        judge(encode(fn, seq_len, d_model, base), *stored("lab01", what), what, ENCODING_RULE)


def check_relative_shift_matrix_shape(fn: Callable[..., Tensor]) -> None:
    """Shape ``(d, d)``, a float matrix, the identity for offset 0 and not for offset 2 (so a
    matrix that ignores its offset, ``torch.eye(d)``, does not pass)."""
    got = expect_shape(shift(fn, 0, 4), (4, 4), "relative_shift_matrix(0, 4)")
    expect_true(
        got.is_floating_point(), f"relative_shift_matrix(0, 4) has dtype {got.dtype}, not float."
    )
    eye = torch.eye(4, dtype=torch.float64)
    expect_close(
        got,
        eye,
        "relative_shift_matrix(0, 4)",
        hint="Moving by 0 positions changes nothing, so M(0) is the identity: each block "
        "is a rotation by angle 0.",
    )
    moved = expect_shape(shift(fn, 2, 4), (4, 4), "relative_shift_matrix(2, 4)")
    expect_true(
        not close(moved.detach().to("cpu", torch.float64), eye),
        "relative_shift_matrix(2, 4) is the identity: it does not move the encoding. Each 2x2 "
        "block must rotate by the angle offset / base**(2i/d).",
    )


def check_relative_shift_matrix(fn: Callable[..., Tensor]) -> None:
    """Worked examples ``fn(1, 6)`` and ``fn(3, 6)``: ``PE[p + k] == PE[p] @ M(k)``."""
    for offset in (1, 3):
        what = call("relative_shift_matrix", offset, 6)
        judge(shift(fn, offset, 6), *stored("lab01", what), what, SHIFT_RULE)
