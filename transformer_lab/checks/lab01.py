"""Checks for lab 01 (positional encoding): ``sinusoidal_encoding`` and ``relative_shift_matrix``.

The notebook's visible test cells call ``check_*`` functions; its hidden test cells call
``hidden_check_*`` with a seed. Every check compares the student's result with an oracle
written here with plain Python loops over ``math.sin``/``math.cos`` (independent of
:mod:`transformer_lab.positional`, which the checks forbid the student's code to call).

When a result is wrong, the check compares it with the outputs of the typical mistakes
(sin and cos swapped, frequency exponent ``i/d`` instead of ``2i/d``, positions counted
from 1, the base argument ignored, sin and cos in two halves instead of interleaved, the
shift matrix transposed or its offset negated, ...) and names the one that matches, so the
feedback says what to fix rather than only that something is off.

Reference: Vaswani et al., "Attention Is All You Need", NeurIPS 2017, section 3.5;
conventions of ../shared/CURRICULUM.md (positions from 0, ``PE[p + k] == PE[p] @ M(k)``).
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from transformer_lab.checks._common import (
    Ban,
    call_student,
    expect_close,
    expect_shape,
    expect_true,
    forbidden,
)

__all__ = [
    "check_relative_shift_matrix",
    "check_relative_shift_matrix_shape",
    "check_sinusoidal_encoding",
    "check_sinusoidal_encoding_shape",
    "hidden_check_relative_shift_matrix",
    "hidden_check_relative_shift_matrix_properties",
    "hidden_check_sinusoidal_encoding",
    "hidden_check_sinusoidal_encoding_properties",
    "oracle_relative_shift_matrix",
    "oracle_sinusoidal_encoding",
]

_REASON = "lab 01 asks you to build the encoding yourself from torch.sin and torch.cos"


# --------------------------------------------------------------------------------------
# Oracles: loops over Python floats, deliberately unlike any vectorised solution
# --------------------------------------------------------------------------------------


def _angle(p: float, pair: int, d_model: int, base: float) -> float:
    """Angle of position ``p`` in sin/cos pair ``pair``: ``p / base**(2*pair/d_model)``."""
    return p / base ** (2 * pair / d_model)


def oracle_sinusoidal_encoding(
    seq_len: int, d_model: int, base: float = 10000.0, *, first: int = 0
) -> Tensor:
    """Reference table ``(seq_len, d_model)`` in float64, positions ``first .. first+T-1``."""
    rows = []
    for p in range(first, first + seq_len):
        row = []
        for j in range(d_model):
            a = _angle(p, j // 2, d_model, base)
            row.append(math.sin(a) if j % 2 == 0 else math.cos(a))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float64).reshape(seq_len, d_model)


def oracle_relative_shift_matrix(offset: float, d_model: int, base: float = 10000.0) -> Tensor:
    """Reference shift matrix ``(d_model, d_model)`` in float64: ``PE[p + k] = PE[p] @ M``.

    Row vector ``[sin a, cos a] @ [[cos b, -sin b], [sin b, cos b]] = [sin(a+b), cos(a+b)]``.
    """
    return _rotations(
        d_model, lambda pair: _angle(offset, pair, d_model, base), lambda pair: 2 * pair
    )


def _rotations(
    d_model: int, angle: Callable[[int], float], sin_col: Callable[[int], int], cos_gap: int = 1
) -> Tensor:
    """``(d_model, d_model)`` float64 matrix of 2x2 rotations, one per sin/cos pair.

    Pair ``i`` turns by ``b = angle(i)``: ``[[cos b, -sin b], [sin b, cos b]]`` on rows and
    columns ``s = sin_col(i)`` and ``s + cos_gap``. Loops over Python floats, like the oracles.
    """
    m = torch.zeros(d_model, d_model, dtype=torch.float64)
    for pair in range(d_model // 2):
        b = angle(pair)
        s = sin_col(pair)
        c = s + cos_gap
        m[s, s], m[s, c] = math.cos(b), -math.sin(b)
        m[c, s], m[c, c] = math.sin(b), math.cos(b)
    return m


# --------------------------------------------------------------------------------------
# The typical mistakes, as tables to compare a wrong answer with
# --------------------------------------------------------------------------------------


def _table(seq_len: int, d_model: int, freq: Callable[[int], float], *, first: int = 0) -> Tensor:
    """Interleaved sin/cos table with column ``j`` at frequency ``freq(j)``."""
    pos = torch.arange(first, first + seq_len, dtype=torch.float64)[:, None]  # (T, 1)
    w = torch.tensor([freq(j) for j in range(d_model)], dtype=torch.float64)[None, :]  # (1, D)
    angles = pos * w  # (T, D)
    out = torch.cos(angles)
    out[:, 0::2] = torch.sin(angles[:, 0::2])
    return out


def _encoding_mistakes(seq_len: int, d_model: int, base: float) -> dict[str, Tensor]:
    """Hint -> the table a typical wrong ``sinusoidal_encoding`` returns."""
    good = oracle_sinusoidal_encoding(seq_len, d_model, base)
    mistakes: dict[str, Tensor] = {}
    swapped = good.clone()
    swapped[:, 0::2], swapped[:, 1::2] = good[:, 1::2], good[:, 0::2]
    mistakes[
        "Your sin and cos are swapped: even columns 2i hold sin and odd columns 2i+1 hold cos."
    ] = swapped
    mistakes[
        "Your positions start at 1; count them from 0, so that row 0 is [0, 1, 0, 1, ...]."
    ] = oracle_sinusoidal_encoding(seq_len, d_model, base, first=1)
    mistakes[
        "Your frequencies use the pair index i in the exponent (base**(i/d)); the lecture's "
        "formula divides by base**(2i/d), i.e. the even column index 2i over d."
    ] = _table(seq_len, d_model, lambda j: base ** (-(j // 2) / d_model))
    mistakes[
        "Each of your columns j uses its own exponent j/d; the sin column 2i and the cos "
        "column 2i+1 must share the frequency 1 / base**(2i/d)."
    ] = _table(seq_len, d_model, lambda j: base ** (-j / d_model))
    mistakes[
        "Your exponent 2i/d is computed with integer division (so it is 0); use true "
        "division or a float tensor."
    ] = _table(seq_len, d_model, lambda j: 1.0)
    mistakes["You multiply by base**(2i/d) instead of dividing by it (a sign in the exponent)."] = (
        _table(seq_len, d_model, lambda j: base ** ((j - j % 2) / d_model))
    )
    if base != 10000.0:
        mistakes[
            f"Your table is built with base 10000, but base={base:g} was passed: use the `base` "
            "argument instead of a hard-coded 10000."
        ] = oracle_sinusoidal_encoding(seq_len, d_model, 10000.0)
    halves = torch.cat([good[:, 0::2], good[:, 1::2]], dim=1)  # (T, D): all sins, then all cos
    mistakes[
        "You put all the sines in the first half of the columns and all the cosines in the "
        "second; interleave them: column 2i is sin, column 2i+1 is cos of the same angle."
    ] = halves
    return mistakes


def _shift_mistakes(offset: float, d_model: int, base: float) -> dict[str, Tensor]:
    """Hint -> the matrix a typical wrong ``relative_shift_matrix`` returns."""
    good = oracle_relative_shift_matrix(offset, d_model, base)
    mistakes: dict[str, Tensor] = {}
    mistakes[
        "Your matrix moves the encoding the wrong way: PE[p] @ M equals PE[p - offset] "
        "instead of PE[p + offset]. Either the sign of the offset is flipped or the matrix "
        "is transposed. In the row convention the block that maps [sin a, cos a] to "
        "[sin(a+b), cos(a+b)] is [[cos b, -sin b], [sin b, cos b]]."
    ] = good.T.clone()
    mistakes[
        "Your matrix is the identity: it does not move the encoding. Each 2x2 block must "
        "rotate by the angle offset / base**(2i/d)."
    ] = torch.eye(d_model, dtype=torch.float64)
    wrong_freq = _rotations(d_model, lambda p: offset / base ** (p / d_model), lambda p: 2 * p)
    mistakes[
        "Your rotation angles use base**(i/d) with the pair index i; the angle of pair i is "
        "offset / base**(2i/d), the frequency of columns 2i and 2i+1 of the encoding."
    ] = wrong_freq
    if base != 10000.0:
        mistakes[
            f"Your matrix is built with base 10000, but base={base:g} was passed: use the "
            "`base` argument."
        ] = oracle_relative_shift_matrix(offset, d_model, 10000.0)
    sin_cos_swapped = good.clone()
    for pair in range(d_model // 2):
        s, c = 2 * pair, 2 * pair + 1
        b = _angle(offset, pair, d_model, base)
        sin_cos_swapped[s, s], sin_cos_swapped[s, c] = math.sin(b), math.cos(b)
        sin_cos_swapped[c, s], sin_cos_swapped[c, c] = math.cos(b), -math.sin(b)
    mistakes[
        "Your 2x2 blocks have sin and cos in each other's places; the block is "
        "[[cos b, -sin b], [sin b, cos b]] (cos on the diagonal)."
    ] = sin_cos_swapped
    halves = _rotations(
        d_model, lambda pair: _angle(offset, pair, d_model, base), lambda p: p, d_model // 2
    )
    mistakes[
        "Your matrix rotates column i together with column i + d/2; in the lecture's "
        "encoding the pairs are neighbours: columns 2i (sin) and 2i+1 (cos)."
    ] = halves
    return mistakes


def _shift_hint(m: Tensor, offset: int, d_model: int, hint: str) -> str:
    """``hint``, preceded by the name of the mistake ``m = M(offset)`` reproduces, if any."""
    known = _diagnose(m, _shift_mistakes(offset, d_model, 10000.0), "")
    return f"{known} {hint}" if known else hint


def _diagnose(got: Tensor, mistakes: dict[str, Tensor], fallback: str) -> str:
    """The hint of the first mistake whose output ``got`` reproduces, else ``fallback``."""
    if tuple(got.shape) == () or not got.is_floating_point():
        return fallback
    g = got.detach().to("cpu", torch.float64)
    for hint, wrong in mistakes.items():
        if g.shape == wrong.shape and torch.allclose(g, wrong, atol=1e-4, rtol=1e-4):
            return hint
    return fallback


def _encoding_fallback(got: Tensor, want: Tensor) -> str:
    """A hint for a wrong table that matches no known mistake: which columns are off."""
    if got.shape != want.shape or not got.is_floating_point():
        return ""
    g, w = got.detach().to("cpu", torch.float64), want
    even_ok = torch.allclose(g[:, 0::2], w[:, 0::2], atol=1e-4)
    odd_ok = torch.allclose(g[:, 1::2], w[:, 1::2], atol=1e-4)
    if even_ok and not odd_ok:
        return "The sin columns (even) are right; check the cos columns (odd)."
    if odd_ok and not even_ok:
        return "The cos columns (odd) are right; check the sin columns (even)."
    if not bool(torch.allclose(g[0], w[0], atol=1e-4)):
        return "Already row 0 (position 0) is off: it should be [0, 1, 0, 1, ...]."
    return "Compare one row with the formula PE[p, 2i] = sin(p / base**(2i/d)) by hand."


# --------------------------------------------------------------------------------------
# Running the student's code under the ban
# --------------------------------------------------------------------------------------


def _package_functions() -> list[types.FunctionType]:
    """Every function and method defined in :mod:`transformer_lab.positional`.

    Banning the whole module (not only the two public functions) also catches helpers and
    ``SinusoidalPositionalEncoding(...).pe``, whose constructor calls the banned function.
    """
    import transformer_lab.positional as positional

    found: list[types.FunctionType] = []
    for value in vars(positional).values():
        members = vars(value).values() if isinstance(value, type) else [value]
        for member in members:
            if isinstance(member, types.FunctionType) and member.__module__ == positional.__name__:
                found.append(member)
    return found


@contextmanager
def _no_shortcuts() -> Iterator[None]:
    with forbidden(Ban(functions=tuple(_package_functions()), reason=_REASON)):
        yield


def _encode(fn: Callable[..., Tensor], *args: float, **kw: float) -> Tensor:
    shown = ", ".join([str(a) for a in args] + [f"{k}={v}" for k, v in kw.items()])
    what = f"sinusoidal_encoding({shown})"
    with _no_shortcuts():
        return call_student(fn, *args, what=what, **kw)


def _shift(fn: Callable[..., Tensor], *args: float, **kw: float) -> Tensor:
    shown = ", ".join([str(a) for a in args] + [f"{k}={v}" for k, v in kw.items()])
    what = f"relative_shift_matrix({shown})"
    with _no_shortcuts():
        return call_student(fn, *args, what=what, **kw)


def _expect_encoding(
    fn: Callable[..., Tensor],
    seq_len: int,
    d_model: int,
    base: float,
    *,
    atol: float = 1e-4,
    rtol: float = 1e-4,
) -> None:
    kw = {} if base == 10000.0 else {"base": base}
    got = _encode(fn, seq_len, d_model, **kw)
    what = "sinusoidal_encoding(" + ", ".join(
        [str(seq_len), str(d_model)] + [f"base={base:g}"] * bool(kw)
    )
    what += ")"
    want = oracle_sinusoidal_encoding(seq_len, d_model, base)
    if tuple(getattr(got, "shape", ())) == (d_model, seq_len) and seq_len != d_model:
        raise AssertionError(
            f"{what} has shape ({d_model}, {seq_len}), expected ({seq_len}, {d_model}): "
            "your table is transposed. Positions go in rows (one row per token), "
            "features in columns."
        )
    expect_shape(got, (seq_len, d_model), what)
    hint = ""
    if isinstance(got, Tensor) and got.is_floating_point():
        g = got.detach().to("cpu", torch.float64)
        if not torch.allclose(g, want, atol=1e-4, rtol=1e-4):
            hint = _diagnose(got, _encoding_mistakes(seq_len, d_model, base), "")
            hint = hint or _encoding_fallback(got, want)
    expect_close(got, want, what, hint=hint, atol=atol, rtol=rtol)


def _expect_shift(fn: Callable[..., Tensor], offset: int, d_model: int, base: float) -> Tensor:
    kw = {} if base == 10000.0 else {"base": base}
    got = _shift(fn, offset, d_model, **kw)
    what = f"relative_shift_matrix({offset}, {d_model}" + (f", base={base:g})" if kw else ")")
    expect_shape(got, (d_model, d_model), what)
    want = oracle_relative_shift_matrix(offset, d_model, base)
    hint = ""
    g = got.detach().to("cpu", torch.float64) if got.is_floating_point() else got
    if got.is_floating_point() and not torch.allclose(g, want, atol=1e-4, rtol=1e-4):
        hint = _diagnose(got, _shift_mistakes(offset, d_model, base), "")
        if not hint:
            pe = oracle_sinusoidal_encoding(8, d_model, base)
            moved = pe[:4] @ g  # (4, D): rows 0..3 moved by the student's matrix
            hint = (
                "PE[p] @ M should equal PE[p + offset]; with your matrix the largest error "
                f"over positions 0-3 is {float((moved - pe[offset : offset + 4]).abs().max()):.3g}."
                if 0 <= offset <= 4
                else "PE[p] @ M should equal PE[p + offset] for every position p."
            )
    expect_close(got, want, what, hint=hint, atol=1e-4, rtol=1e-4)
    return got


# --------------------------------------------------------------------------------------
# Visible checks (shown to students)
# --------------------------------------------------------------------------------------


def check_sinusoidal_encoding_shape(fn: Callable[..., Tensor]) -> None:
    """Shape, dtype and the first row of ``fn(4, 6)``: position 0 is ``[0, 1, 0, 1, 0, 1]``."""
    got = _encode(fn, 4, 6)
    if tuple(getattr(got, "shape", ())) == (6, 4):
        raise AssertionError(
            "sinusoidal_encoding(4, 6) has shape (6, 4), expected (4, 6): your table is "
            "transposed. Positions go in rows, features in columns."
        )
    got = expect_shape(got, (4, 6), "sinusoidal_encoding(4, 6)")
    expect_true(
        got.is_floating_point(),
        f"sinusoidal_encoding(4, 6) has dtype {got.dtype}; the encoding is real-valued. "
        "Use a float tensor (e.g. torch.arange(..., dtype=torch.float32)).",
    )
    row0 = got[0].detach().to("cpu", torch.float64)
    want0 = torch.tensor([0.0, 1.0] * 3, dtype=torch.float64)
    if torch.allclose(row0, want0.flip(0), atol=1e-5):
        raise AssertionError(
            "Row 0 of sinusoidal_encoding(4, 6) is [1, 0, 1, 0, 1, 0], expected "
            "[0, 1, 0, 1, 0, 1] (sin 0 = 0, cos 0 = 1): your sin and cos are swapped."
        )
    hint = "Position 0 has every angle 0, so sin columns are 0 and cos columns are 1."
    if not torch.allclose(row0, want0, atol=1e-4):
        hint = _diagnose(got, _encoding_mistakes(4, 6, 10000.0), hint)
    expect_close(row0, want0, "row 0 (position 0) of sinusoidal_encoding(4, 6)", hint=hint)


def check_sinusoidal_encoding(fn: Callable[..., Tensor]) -> None:
    """Worked examples ``fn(5, 4)``, ``fn(6, 8)``, ``fn(3, 4, base=100.0)`` against the formula."""
    _expect_encoding(fn, 5, 4, 10000.0)
    _expect_encoding(fn, 6, 8, 10000.0)
    _expect_encoding(fn, 3, 4, 100.0)


def check_relative_shift_matrix_shape(fn: Callable[..., Tensor]) -> None:
    """Shape ``(d, d)`` and the identity for offset 0."""
    got = _shift(fn, 0, 4)
    got = expect_shape(got, (4, 4), "relative_shift_matrix(0, 4)")
    expect_true(
        got.is_floating_point(), f"relative_shift_matrix(0, 4) has dtype {got.dtype}, not float."
    )
    expect_close(
        got,
        torch.eye(4, dtype=torch.float64),
        "relative_shift_matrix(0, 4)",
        hint="Moving by 0 positions changes nothing, so M(0) is the identity: each block "
        "is a rotation by angle 0.",
    )


def check_relative_shift_matrix(fn: Callable[..., Tensor]) -> None:
    """``PE[p + k] == PE[p] @ M(k)`` for small ``k``, checked on the encoding's rows."""
    d_model = 6
    pe = oracle_sinusoidal_encoding(12, d_model)
    for offset in (1, 3):
        m = _expect_shift(fn, offset, d_model, 10000.0).detach().to("cpu", torch.float64)
        moved = pe[:5] @ m  # (5, D): rows 0..4 moved by M
        what = f"PE[0:5] @ relative_shift_matrix({offset}, 6)"
        expect_close(moved, pe[offset : offset + 5], what)


# --------------------------------------------------------------------------------------
# Hidden checks (nbgrader hides the cells that call these)
# --------------------------------------------------------------------------------------


def hidden_check_sinusoidal_encoding(fn: Callable[..., Tensor], seed: int = 0) -> None:
    """Random sizes and bases (seeded) against the loop oracle."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(3):
        seq_len = int(torch.randint(2, 40, (1,), generator=g))
        d_model = 2 * int(torch.randint(1, 17, (1,), generator=g))
        base = float(torch.tensor([10000.0, 500.0, 64.0])[torch.randint(0, 3, (1,), generator=g)])
        _expect_encoding(fn, seq_len, d_model, base)


def hidden_check_sinusoidal_encoding_properties(fn: Callable[..., Tensor], seed: int = 0) -> None:
    """Edge sizes (one position, two features, odd-sized lengths, long sequences) and properties."""
    _expect_encoding(fn, 1, 2, 10000.0)
    _expect_encoding(fn, 7, 2, 10000.0)
    g = torch.Generator().manual_seed(seed)
    d_model = 2 * int(torch.randint(4, 10, (1,), generator=g))
    got = _encode(fn, 200, d_model)
    got = expect_shape(got, (200, d_model), f"sinusoidal_encoding(200, {d_model})")
    t = got.detach().to("cpu", torch.float64)
    expect_true(
        bool((t.abs() <= 1.0 + 1e-5).all()),
        f"sinusoidal_encoding(200, {d_model}) has entries of size {float(t.abs().max()):.3g}; "
        "sines and cosines stay within [-1, 1]. Did you add or scale something?",
    )
    norms = t.norm(dim=1)
    expect_close(
        norms,
        torch.full_like(norms, math.sqrt(d_model / 2)),
        f"row norms of sinusoidal_encoding(200, {d_model})",
        hint="Every row holds d/2 (sin, cos) pairs of one angle each, so its norm is sqrt(d/2).",
        atol=1e-3,
    )
    # float32 angles of a few hundred radians carry errors of ~1e-5: allow a little more.
    _expect_encoding(fn, 200, d_model, 10000.0, atol=2e-4, rtol=1e-3)


def hidden_check_relative_shift_matrix(fn: Callable[..., Tensor], seed: int = 0) -> None:
    """Random offsets (positive, negative), widths and bases against the oracle."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(3):
        offset = int(torch.randint(-20, 21, (1,), generator=g))
        offset = offset if offset != 0 else 5
        d_model = 2 * int(torch.randint(1, 13, (1,), generator=g))
        base = float(torch.tensor([10000.0, 300.0])[torch.randint(0, 2, (1,), generator=g)])
        _expect_shift(fn, offset, d_model, base)


def hidden_check_relative_shift_matrix_properties(fn: Callable[..., Tensor], seed: int = 0) -> None:
    """Properties: rotations (``M M^T = I``), ``M(a) @ M(b) == M(a + b)``, ``M(-k) == M(k)^T``."""
    g = torch.Generator().manual_seed(seed)
    d_model = 2 * int(torch.randint(2, 8, (1,), generator=g))
    a, b = (int(x) for x in torch.randint(1, 30, (2,), generator=g))
    ma = _shift(fn, a, d_model)
    ma = expect_shape(ma, (d_model, d_model), f"relative_shift_matrix({a}, {d_model})")
    ma = ma.detach().to("cpu", torch.float64)
    mb = _shift(fn, b, d_model)
    mb = expect_shape(mb, (d_model, d_model), f"relative_shift_matrix({b}, {d_model})")
    mb = mb.detach().to("cpu", torch.float64)
    expect_close(
        ma @ ma.T,
        torch.eye(d_model, dtype=torch.float64),
        f"M @ M.T for M = relative_shift_matrix({a}, {d_model})",
        hint=_shift_hint(
            ma,
            a,
            d_model,
            "Moving an encoding does not change its length, so M is a rotation (orthogonal). "
            "Each 2x2 block needs cos on the diagonal and +/-sin off it.",
        ),
        atol=1e-4,
    )
    mab = _shift(fn, a + b, d_model)
    expect_close(
        ma @ mb,
        expect_shape(mab, (d_model, d_model), f"relative_shift_matrix({a + b}, {d_model})"),
        f"relative_shift_matrix({a}, {d_model}) @ relative_shift_matrix({b}, {d_model})",
        hint=_shift_hint(
            ma, a, d_model, f"Moving by {a} then by {b} positions must equal moving by {a + b}."
        ),
        atol=1e-4,
    )
    _expect_shift(fn, -a, d_model, 10000.0)
    _expect_shift(fn, 1000, 2, 10000.0)
