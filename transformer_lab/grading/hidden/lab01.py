"""Hidden checks of lab 01 (positional encoding), their oracles and the visible checks' fixtures.

The oracles are plain Python loops over ``math.sin``/``math.cos``, unlike any vectorised
solution; the mistake catalogues give the table each typical mistake produces, so that a wrong
answer is named.

Reference: Vaswani et al., "Attention Is All You Need", NeurIPS 2017, section 3.5.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from transformer_lab.checks._common import expect_close, expect_shape, expect_true, generator
from transformer_lab.checks.lab01 import (
    ENCODING_RULE,
    SHIFT_RULE,
    SPEC,
    call,
    encode,
    judge,
    shift,
)
from transformer_lab.grading.hidden import fixture_entry

__all__ = [
    "fixtures",
    "hidden_check_relative_shift_matrix",
    "hidden_check_relative_shift_matrix_properties",
    "hidden_check_sinusoidal_encoding",
    "hidden_check_sinusoidal_encoding_properties",
    "oracle_relative_shift_matrix",
    "oracle_sinusoidal_encoding",
]


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


def oracle_relative_shift_matrix(offset: float, d_model: int, base: float = 10000.0) -> Tensor:
    """Reference shift matrix ``(d_model, d_model)`` in float64: ``PE[p + k] = PE[p] @ M``.

    Row vector ``[sin a, cos a] @ [[cos b, -sin b], [sin b, cos b]] = [sin(a+b), cos(a+b)]``.
    """
    return _rotations(
        d_model, lambda pair: _angle(offset, pair, d_model, base), lambda pair: 2 * pair
    )


def _table(seq_len: int, d_model: int, freq: Callable[[int], float]) -> Tensor:
    """Interleaved sin/cos table with column ``j`` at frequency ``freq(j)``."""
    pos = torch.arange(seq_len, dtype=torch.float64)[:, None]  # (T, 1)
    w = torch.tensor([freq(j) for j in range(d_model)], dtype=torch.float64)[None, :]  # (1, D)
    angles = pos * w  # (T, D)
    out = torch.cos(angles)
    out[:, 0::2] = torch.sin(angles[:, 0::2])
    return out


def encoding_mistakes(seq_len: int, d_model: int, base: float) -> dict[str, Tensor]:
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


def shift_mistakes(offset: float, d_model: int, base: float) -> dict[str, Tensor]:
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
    mistakes[
        "Your rotation angles use base**(i/d) with the pair index i; the angle of pair i is "
        "offset / base**(2i/d), the frequency of columns 2i and 2i+1 of the encoding."
    ] = _rotations(d_model, lambda p: offset / base ** (p / d_model), lambda p: 2 * p)
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
    mistakes[
        "Your matrix rotates column i together with column i + d/2; in the lecture's "
        "encoding the pairs are neighbours: columns 2i (sin) and 2i+1 (cos)."
    ] = _rotations(
        d_model, lambda pair: _angle(offset, pair, d_model, base), lambda p: p, d_model // 2
    )
    return mistakes


def _expect_encoding(
    fn: Callable[..., Tensor], seq_len: int, d_model: int, base: float, **tolerance: float
) -> None:
    judge(
        encode(fn, seq_len, d_model, base),
        oracle_sinusoidal_encoding(seq_len, d_model, base),
        encoding_mistakes(seq_len, d_model, base),
        call("sinusoidal_encoding", seq_len, d_model, base),
        ENCODING_RULE,
        **tolerance,
    )


def _expect_shift(fn: Callable[..., Tensor], offset: int, d_model: int, base: float) -> Tensor:
    return judge(
        shift(fn, offset, d_model, base),
        oracle_relative_shift_matrix(offset, d_model, base),
        shift_mistakes(offset, d_model, base),
        call("relative_shift_matrix", offset, d_model, base),
        SHIFT_RULE,
    )


def hidden_check_sinusoidal_encoding(fn: Callable[..., Tensor], seed: int = 0) -> None:
    """Random sizes and bases (seeded) against the loop oracle."""
    g = generator(seed)
    for _ in range(3):
        seq_len = int(torch.randint(2, 40, (1,), generator=g))
        d_model = 2 * int(torch.randint(1, 17, (1,), generator=g))
        base = float(torch.tensor([10000.0, 500.0, 64.0])[torch.randint(0, 3, (1,), generator=g)])
        _expect_encoding(fn, seq_len, d_model, base)


def hidden_check_sinusoidal_encoding_properties(fn: Callable[..., Tensor], seed: int = 0) -> None:
    """Edge sizes (one position, two features, long sequences) and properties."""
    _expect_encoding(fn, 1, 2, 10000.0)
    _expect_encoding(fn, 7, 2, 10000.0)
    g = generator(seed)
    d_model = 2 * int(torch.randint(4, 10, (1,), generator=g))
    what = f"sinusoidal_encoding(200, {d_model})"
    t = expect_shape(encode(fn, 200, d_model), (200, d_model), what)
    t = t.detach().to("cpu", torch.float64)
    expect_true(
        bool((t.abs() <= 1.0 + 1e-5).all()),
        f"{what} has entries of size {float(t.abs().max()):.3g}; sines and cosines stay within "
        "[-1, 1]. Did you add or scale something?",
    )
    norms = t.norm(dim=1)
    expect_close(
        norms,
        torch.full_like(norms, math.sqrt(d_model / 2)),
        f"row norms of {what}",
        hint="Every row holds d/2 (sin, cos) pairs of one angle each, so its norm is sqrt(d/2).",
        atol=SPEC.tol("row_norm"),
    )
    _expect_encoding(fn, 200, d_model, 10000.0, **SPEC.close_tol("long_angles"))


def hidden_check_relative_shift_matrix(fn: Callable[..., Tensor], seed: int = 0) -> None:
    """Random offsets (positive, negative), widths and bases against the oracle."""
    g = generator(seed)
    for _ in range(3):
        offset = int(torch.randint(-20, 21, (1,), generator=g))
        offset = offset if offset != 0 else 5
        d_model = 2 * int(torch.randint(1, 13, (1,), generator=g))
        base = float(torch.tensor([10000.0, 300.0])[torch.randint(0, 2, (1,), generator=g)])
        _expect_shift(fn, offset, d_model, base)


def hidden_check_relative_shift_matrix_properties(fn: Callable[..., Tensor], seed: int = 0) -> None:
    """Properties: rotations (``M M^T = I``), ``M(a) @ M(b) == M(a + b)``, ``M(-k) == M(k)^T``."""
    g = generator(seed)
    d_model = 2 * int(torch.randint(2, 8, (1,), generator=g))
    a, b = (int(x) for x in torch.randint(1, 30, (2,), generator=g))

    def matrix(offset: int) -> Tensor:
        what = f"relative_shift_matrix({offset}, {d_model})"
        return expect_shape(shift(fn, offset, d_model), (d_model, d_model), what)

    ma = matrix(a).detach().to("cpu", torch.float64)
    mb = matrix(b).detach().to("cpu", torch.float64)
    expect_close(
        ma @ ma.T,
        torch.eye(d_model, dtype=torch.float64),
        f"M @ M.T for M = relative_shift_matrix({a}, {d_model})",
        hint="Moving an encoding does not change its length, so M is a rotation (orthogonal). "
        "Each 2x2 block needs cos on the diagonal and +/-sin off it.",
        atol=SPEC.tol("float32"),
    )
    expect_close(
        ma @ mb,
        matrix(a + b),
        f"relative_shift_matrix({a}, {d_model}) @ relative_shift_matrix({b}, {d_model})",
        hint=f"Moving by {a} then by {b} positions must equal moving by {a + b}.",
        atol=SPEC.tol("float32"),
    )
    _expect_shift(fn, -a, d_model, 10000.0)
    _expect_shift(fn, 1000, 2, 10000.0)


def fixtures() -> dict[str, dict[str, Any]]:
    """The stored examples of :mod:`transformer_lab.checks.lab01`, keyed by the call."""
    out: dict[str, dict[str, Any]] = {}
    for seq_len, d_model, base in (
        (4, 6, 10000.0),
        (5, 4, 10000.0),
        (6, 8, 10000.0),
        (3, 4, 100.0),
    ):
        out[call("sinusoidal_encoding", seq_len, d_model, base)] = fixture_entry(
            oracle_sinusoidal_encoding(seq_len, d_model, base),
            encoding_mistakes(seq_len, d_model, base),
        )
    for offset in (1, 3):
        out[f"relative_shift_matrix({offset}, 6)"] = fixture_entry(
            oracle_relative_shift_matrix(offset, 6), shift_mistakes(offset, 6, 10000.0)
        )
    return out
