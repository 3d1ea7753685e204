"""Visible checks of lab 01 (positional encoding): sinusoidal_encoding, relative_shift_matrix.

The notebook's visible test cells call the ``check_*`` functions here. They run the student's
function on a few worked examples whose expected tables are stored in ``fixtures/lab01.json``
(written from the hidden checks' oracle when the instructor builds the labs), together with
the tables the typical mistakes produce: sin and cos swapped, the frequency exponent ``i/d``
instead of ``2i/d``, positions counted from 1, the base argument ignored, sines and cosines in
two halves instead of interleaved, the shift matrix transposed or its offset negated... A wrong
answer is compared with those tables and the message names the mistake it reproduces. No
oracle lives here: the student package holds only these stored examples.

While the student's function runs, the kit's own positional module is refused
(:class:`~transformer_lab.judge.bans.Ban`), so an answer that calls it earns nothing.

Reference: Vaswani et al., "Attention Is All You Need", NeurIPS 2017, section 3.5; the course's
conventions in ``docs/curriculum.md`` (positions from 0, ``PE[p + k] == PE[p] @ M(k)``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from transformer_lab.checks import spec
from transformer_lab.checks._common import (
    call_forbidding,
    close,
    expect_close,
    expect_shape,
    expect_true,
    note_mistake,
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


def _show(args: tuple[float, ...], base: float) -> str:
    shown = [str(a) for a in args] + ([f"base={base:g}"] if base != 10000.0 else [])
    return ", ".join(shown)


def encode(fn: Callable[..., Tensor], seq_len: int, d_model: int, base: float = 10000.0) -> Tensor:
    """The student's ``sinusoidal_encoding(seq_len, d_model[, base])`` under the lab's ban."""
    kwargs = {} if base == 10000.0 else {"base": base}
    what = f"sinusoidal_encoding({_show((seq_len, d_model), base)})"
    return call_forbidding(fn, (seq_len, d_model), kwargs, ban=BAN, what=what)


def shift(fn: Callable[..., Tensor], offset: int, d_model: int, base: float = 10000.0) -> Tensor:
    """The student's ``relative_shift_matrix(offset, d_model[, base])`` under the lab's ban."""
    kwargs = {} if base == 10000.0 else {"base": base}
    what = f"relative_shift_matrix({_show((offset, d_model), base)})"
    return call_forbidding(fn, (offset, d_model), kwargs, ban=BAN, what=what)


def diagnose(got: Tensor, mistakes: Mapping[str, Tensor], fallback: str = "") -> str:
    """The hint of the first mistake whose table ``got`` reproduces, else ``fallback``."""
    if not isinstance(got, Tensor) or tuple(got.shape) == () or not got.is_floating_point():
        return fallback
    g = got.detach().to("cpu", torch.float64)
    for hint, wrong in mistakes.items():
        if g.shape == wrong.shape and torch.allclose(g, wrong, atol=_TOL, rtol=_TOL):
            note_mistake(hint)
            return hint
    return fallback


def _encoding_fallback(got: Tensor, want: Tensor) -> str:
    """A hint for a wrong table that matches no known mistake: which columns are off."""
    if got.shape != want.shape or not got.is_floating_point():
        return ""
    g = got.detach().to("cpu", torch.float64)
    even_ok = torch.allclose(g[:, 0::2], want[:, 0::2], atol=_TOL)
    odd_ok = torch.allclose(g[:, 1::2], want[:, 1::2], atol=_TOL)
    if even_ok and not odd_ok:
        return "The sin columns (even) are right; check the cos columns (odd)."
    if odd_ok and not even_ok:
        return "The cos columns (odd) are right; check the sin columns (even)."
    if not bool(torch.allclose(g[0], want[0], atol=_TOL)):
        return "Already row 0 (position 0) is off: it should be [0, 1, 0, 1, ...]."
    return "Compare one row with the formula PE[p, 2i] = sin(p / base**(2i/d)) by hand."


def judge_encoding(
    got: object,
    want: Tensor,
    mistakes: Mapping[str, Tensor],
    what: str,
    *,
    atol: float = _TOL,
    rtol: float = _TOL,
) -> None:
    """Compare a student's table with the expected one; name the mistake it reproduces.

    Args:
        got: what the student's ``sinusoidal_encoding`` returned.
        want: the expected table ``(T, D)`` (float64).
        mistakes: hint -> the table that typical mistake produces.
        what: the call, for messages.
        atol: absolute tolerance.
        rtol: relative tolerance.
    """
    seq_len, d_model = want.shape
    if tuple(getattr(got, "shape", ())) == (d_model, seq_len) and seq_len != d_model:
        raise AssertionError(
            f"{what} has shape ({d_model}, {seq_len}), expected ({seq_len}, {d_model}): your "
            "table is transposed. Positions go in rows (one row per token), features in columns."
        )
    got = expect_shape(got, (seq_len, d_model), what)
    hint = ""
    if got.is_floating_point():
        g = got.detach().to("cpu", torch.float64)
        if not torch.allclose(g, want, atol=_TOL, rtol=_TOL):
            hint = diagnose(got, mistakes) or _encoding_fallback(got, want)
    expect_close(got, want, what, hint=hint, atol=atol, rtol=rtol)


def judge_shift(
    got: object,
    want: Tensor,
    mistakes: Mapping[str, Tensor],
    what: str,
    offset: int,
    table: Tensor | None = None,
) -> Tensor:
    """Compare a student's shift matrix with the expected one; name the mistake it reproduces.

    Args:
        got: what the student's ``relative_shift_matrix`` returned.
        want: the expected ``(D, D)`` matrix (float64).
        mistakes: hint -> the matrix that typical mistake produces.
        what: the call, for messages.
        offset: the offset it was called with.
        table: the encoding's first rows (float64), to say how far ``PE[p] @ M`` is off.

    Returns:
        The student's matrix as a tensor.
    """
    d_model = want.shape[0]
    got = expect_shape(got, (d_model, d_model), what)
    hint = ""
    if got.is_floating_point():
        g = got.detach().to("cpu", torch.float64)
        if not torch.allclose(g, want, atol=_TOL, rtol=_TOL):
            hint = diagnose(got, mistakes)
            if not hint and table is not None and 0 <= offset <= table.shape[0] - 4:
                moved = table[:4] @ g  # (4, D): rows 0..3 moved by the student's matrix
                error = float((moved - table[offset : offset + 4]).abs().max())
                hint = (
                    "PE[p] @ M should equal PE[p + offset]; with your matrix the largest error "
                    f"over positions 0-3 is {error:.3g}."
                )
            hint = hint or "PE[p] @ M should equal PE[p + offset] for every position p."
    expect_close(got, want, what, hint=hint, atol=_TOL, rtol=_TOL)
    return got


# --------------------------------------------------------------------------------------
# Visible checks
# --------------------------------------------------------------------------------------


def check_sinusoidal_encoding_shape(fn: Callable[..., Tensor]) -> None:
    """Shape, dtype and the first row of ``fn(4, 6)``: position 0 is ``[0, 1, 0, 1, 0, 1]``."""
    got = encode(fn, 4, 6)
    what = "sinusoidal_encoding(4, 6)"
    if tuple(getattr(got, "shape", ())) == (6, 4):
        raise AssertionError(
            f"{what} has shape (6, 4), expected (4, 6): your table is transposed. Positions go "
            "in rows, features in columns."
        )
    got = expect_shape(got, (4, 6), what)
    expect_true(
        got.is_floating_point(),
        f"{what} has dtype {got.dtype}; the encoding is real-valued. Use a float tensor "
        "(e.g. torch.arange(..., dtype=torch.float32)).",
    )
    row0 = got[0].detach().to("cpu", torch.float64)
    want0 = torch.tensor([0.0, 1.0] * 3, dtype=torch.float64)
    if torch.allclose(row0, want0.flip(0), atol=1e-5):
        raise AssertionError(
            f"Row 0 of {what} is [1, 0, 1, 0, 1, 0], expected [0, 1, 0, 1, 0, 1] (sin 0 = 0, "
            "cos 0 = 1): your sin and cos are swapped."
        )
    hint = "Position 0 has every angle 0, so sin columns are 0 and cos columns are 1."
    if not torch.allclose(row0, want0, atol=_TOL):
        _, mistakes = stored("lab01", what)
        hint = diagnose(got, mistakes, hint)
    expect_close(row0, want0, f"row 0 (position 0) of {what}", hint=hint)
    # A second size, so that a table that ignores its arguments does not pass.
    expect_shape(encode(fn, 3, 2), (3, 2), "sinusoidal_encoding(3, 2)")


def check_sinusoidal_encoding(fn: Callable[..., Tensor]) -> None:
    """Worked examples ``fn(5, 4)``, ``fn(6, 8)``, ``fn(3, 4, base=100.0)``."""
    for seq_len, d_model, base in ((5, 4, 10000.0), (6, 8, 10000.0), (3, 4, 100.0)):
        what = f"sinusoidal_encoding({_show((seq_len, d_model), base)})"
        want, mistakes = stored("lab01", what)
        judge_encoding(encode(fn, seq_len, d_model, base), want, mistakes, what)


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
    """``PE[p + k] == PE[p] @ M(k)`` for ``k = 1, 3``, on the stored rows of the encoding."""
    table, _ = stored("lab01", "sinusoidal_encoding(12, 6)")
    for offset in (1, 3):
        what = f"relative_shift_matrix({offset}, 6)"
        want, mistakes = stored("lab01", what)
        m = judge_shift(shift(fn, offset, 6), want, mistakes, what, offset, table)
        moved = table[:5] @ m.detach().to("cpu", torch.float64)  # (5, D): rows 0..4 moved by M
        expect_close(moved, table[offset : offset + 5], f"PE[0:5] @ {what}")
