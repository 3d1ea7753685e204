"""Lab 01 checks against a catalogue of typical mistakes and of correct variants (no nbgrader).

Each wrong implementation must fail the check that should catch it, with a message naming the
mistake; each correct variant (vectorised, loops, float64, stacked, rotation built by
composition) must pass every check, visible and hidden.
"""

from __future__ import annotations

import math

import pytest
import torch
from check_support import assert_fails, run_checks

import transformer_lab.positional as positional
from transformer_lab.checks import lab01
from transformer_lab.grading.hidden import lab01 as hidden01

ENC_CHECKS = {
    "shape": lab01.check_sinusoidal_encoding_shape,
    "values": lab01.check_sinusoidal_encoding,
    "hidden": lambda fn: hidden01.hidden_check_sinusoidal_encoding(fn, seed=1101),
    "properties": lambda fn: hidden01.hidden_check_sinusoidal_encoding_properties(fn, seed=1103),
}
SHIFT_CHECKS = {
    "shape": lab01.check_relative_shift_matrix_shape,
    "values": lab01.check_relative_shift_matrix,
    "hidden": lambda fn: hidden01.hidden_check_relative_shift_matrix(fn, seed=1201),
    "properties": lambda fn: hidden01.hidden_check_relative_shift_matrix_properties(fn, seed=1203),
}


# ---------------------------------------------------------------- sinusoidal_encoding


def _angles(seq_len, d_model, base, first=0, exponent=lambda two_i, d: two_i / d):
    pos = torch.arange(first, first + seq_len, dtype=torch.float32)[:, None]  # (T, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float32)  # (D/2,)
    return pos / base ** exponent(two_i, d_model)  # (T, D/2)


def _interleave(sin, cos):
    return torch.stack([sin, cos], dim=-1).flatten(-2)  # (T, D/2, 2) -> (T, D)


def enc_vectorised(seq_len, d_model, base=10000.0):
    a = _angles(seq_len, d_model, base)
    return _interleave(torch.sin(a), torch.cos(a))


def enc_loops(seq_len, d_model, base=10000.0):
    pe = torch.zeros(seq_len, d_model)
    for p in range(seq_len):
        for i in range(0, d_model, 2):
            pe[p, i] = math.sin(p / base ** (i / d_model))
            pe[p, i + 1] = math.cos(p / base ** (i / d_model))
    return pe


def enc_float64_exp_log(seq_len, d_model, base=10000.0):
    pos = torch.arange(seq_len, dtype=torch.float64)[:, None]
    freq = torch.exp(-torch.arange(0, d_model, 2, dtype=torch.float64) * math.log(base) / d_model)
    pe = torch.empty(seq_len, d_model, dtype=torch.float64)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * freq), torch.cos(pos * freq)
    return pe


def enc_swapped(seq_len, d_model, base=10000.0):
    a = _angles(seq_len, d_model, base)
    return _interleave(torch.cos(a), torch.sin(a))


def enc_pair_index_exponent(seq_len, d_model, base=10000.0):
    a = _angles(seq_len, d_model, base, exponent=lambda two_i, d: (two_i / 2) / d)
    return _interleave(torch.sin(a), torch.cos(a))


def enc_from_one(seq_len, d_model, base=10000.0):
    a = _angles(seq_len, d_model, base, first=1)
    return _interleave(torch.sin(a), torch.cos(a))


def enc_transposed(seq_len, d_model, base=10000.0):
    return enc_vectorised(seq_len, d_model, base).T


def enc_base_ignored(seq_len, d_model, base=10000.0):
    return enc_vectorised(seq_len, d_model, 10000.0)


def enc_halves(seq_len, d_model, base=10000.0):
    a = _angles(seq_len, d_model, base)
    return torch.cat([torch.sin(a), torch.cos(a)], dim=1)


def enc_integer_division(seq_len, d_model, base=10000.0):
    a = _angles(seq_len, d_model, base, exponent=lambda two_i, d: torch.div(two_i, d).floor())
    return _interleave(torch.sin(a), torch.cos(a))


def enc_calls_package(seq_len, d_model, base=10000.0):
    return positional.sinusoidal_encoding(seq_len, d_model, base)


def enc_uses_module(seq_len, d_model, base=10000.0):
    return positional.SinusoidalPositionalEncoding(d_model, seq_len, base).pe.clone()


def enc_not_implemented(seq_len, d_model, base=10000.0):
    raise NotImplementedError()


@pytest.mark.parametrize("fn", [enc_vectorised, enc_loops, enc_float64_exp_log])
def test_correct_encodings_pass_every_check(fn) -> None:
    assert run_checks(ENC_CHECKS, fn) == dict.fromkeys(ENC_CHECKS, "")


#: (the mistake, ..., words its messages must contain): the catalogue, also read by test_diagnosis
ENC_MISTAKES = [
    (enc_swapped, ["shape", "values", "hidden", "properties"], "sin and cos are swapped"),
    (enc_pair_index_exponent, ["values", "hidden", "properties"], "pair index i"),
    (enc_from_one, ["shape", "values", "hidden", "properties"], "start at 1"),
    (enc_transposed, ["shape", "values", "hidden", "properties"], "in the wrong order"),
    (enc_base_ignored, ["values", "hidden"], "hard-coded 10000"),
    (enc_halves, ["shape", "values", "hidden", "properties"], "first half"),
    (enc_integer_division, ["values", "hidden", "properties"], "integer division"),
]


@pytest.mark.parametrize(("fn", "failing", "words"), ENC_MISTAKES)
def test_encoding_mistakes_fail_with_a_message_naming_them(fn, failing, words) -> None:
    outcomes = run_checks(ENC_CHECKS, fn)
    assert sorted(name for name, msg in outcomes.items() if msg) == sorted(failing)
    for name in failing:
        assert words in outcomes[name], (name, outcomes[name])


@pytest.mark.parametrize("fn", [enc_calls_package, enc_uses_module])
def test_calling_the_package_earns_nothing(fn) -> None:
    outcomes = run_checks(ENC_CHECKS, fn)
    assert all("does not allow" in msg for msg in outcomes.values()), outcomes
    # ... and the package works again afterwards.
    assert positional.sinusoidal_encoding(3, 4).shape == (3, 4)


def test_not_implemented_says_so() -> None:
    outcomes = run_checks(ENC_CHECKS, enc_not_implemented)
    assert all("not implemented yet" in msg for msg in outcomes.values())


# ---------------------------------------------------------------- relative_shift_matrix


def _blocks(offset, d_model, base, block, exponent=lambda two_i, d: two_i / d):
    m = torch.zeros(d_model, d_model)
    for two_i in range(0, d_model, 2):
        b = offset / base ** exponent(two_i, d_model)
        m[two_i : two_i + 2, two_i : two_i + 2] = torch.tensor(block(b), dtype=torch.float32)
    return m


def _rotation(b):
    return [[math.cos(b), -math.sin(b)], [math.sin(b), math.cos(b)]]


def shift_loops(offset, d_model, base=10000.0):
    return _blocks(offset, d_model, base, _rotation)


def shift_block_diag(offset, d_model, base=10000.0):
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    b = offset / base ** (two_i / d_model)  # (D/2,)
    blocks = torch.stack(
        [torch.stack([b.cos(), -b.sin()], -1), torch.stack([b.sin(), b.cos()], -1)], -2
    )  # (D/2, 2, 2)
    return torch.block_diag(*blocks).float()


def shift_from_composition(offset, d_model, base=10000.0):
    # M(k) = M(1)^k: build the one-step rotation and raise it to the offset's power.
    one = shift_block_diag(1, d_model, base).double()
    return torch.linalg.matrix_power(one, offset).float()


def shift_transposed(offset, d_model, base=10000.0):
    return shift_loops(offset, d_model, base).T


def shift_negated(offset, d_model, base=10000.0):
    return shift_loops(-offset, d_model, base)


def shift_identity(offset, d_model, base=10000.0):
    return torch.eye(d_model)


def shift_pair_index(offset, d_model, base=10000.0):
    return _blocks(offset, d_model, base, _rotation, exponent=lambda two_i, d: (two_i / 2) / d)


def shift_base_ignored(offset, d_model, base=10000.0):
    return shift_loops(offset, d_model, 10000.0)


def shift_sin_cos_swapped(offset, d_model, base=10000.0):
    return _blocks(
        offset, d_model, base, lambda b: [[math.sin(b), math.cos(b)], [math.cos(b), -math.sin(b)]]
    )


def shift_halves(offset, d_model, base=10000.0):
    m = torch.zeros(d_model, d_model)
    half = d_model // 2
    for i in range(half):
        b = offset / base ** (2 * i / d_model)
        m[i, i], m[i, i + half] = math.cos(b), -math.sin(b)
        m[i + half, i], m[i + half, i + half] = math.sin(b), math.cos(b)
    return m


def shift_calls_package(offset, d_model, base=10000.0):
    return positional.relative_shift_matrix(offset, d_model, base)


@pytest.mark.parametrize("fn", [shift_loops, shift_block_diag, shift_from_composition])
def test_correct_shift_matrices_pass_every_check(fn) -> None:
    assert run_checks(SHIFT_CHECKS, fn) == dict.fromkeys(SHIFT_CHECKS, "")


#: (the mistake, ..., words its messages must contain): the catalogue, also read by test_diagnosis
SHIFT_MISTAKES = [
    (shift_transposed, ["values", "hidden", "properties"], "moves the encoding the wrong way"),
    (shift_negated, ["values", "hidden", "properties"], "sign of the offset is flipped"),
    (shift_identity, ["shape", "values", "hidden", "properties"], "identity"),
    (shift_pair_index, ["values", "hidden", "properties"], "pair index i"),
    (shift_base_ignored, ["hidden"], "use the `base` argument"),
    (
        shift_sin_cos_swapped,
        ["shape", "values", "hidden", "properties"],
        {
            "shape": "M(0) is the identity",
            "values": "cos on the diagonal",
            "hidden": "cos on the diagonal",
            "properties": "must equal",
        },
    ),
    (shift_halves, ["values", "hidden", "properties"], "column i + d/2"),
]


@pytest.mark.parametrize(("fn", "failing", "words"), SHIFT_MISTAKES)
def test_shift_mistakes_fail_with_a_message_naming_them(fn, failing, words) -> None:
    generic = tuple(failing[:1]) if fn is shift_sin_cos_swapped else ()
    assert_fails(SHIFT_CHECKS, fn, failing, words, generic=generic)


def test_shift_calling_the_package_earns_nothing() -> None:
    outcomes = run_checks(SHIFT_CHECKS, shift_calls_package)
    assert all("does not allow" in msg for msg in outcomes.values()), outcomes


def test_oracles_agree_with_the_package() -> None:
    # The oracle is independent code: it must agree with the kit's implementation.
    torch.testing.assert_close(
        hidden01.oracle_sinusoidal_encoding(50, 12, 500.0),
        positional.sinusoidal_encoding(50, 12, 500.0, dtype=torch.float64),
    )
    torch.testing.assert_close(
        hidden01.oracle_relative_shift_matrix(-7, 12),
        positional.relative_shift_matrix(-7, 12, dtype=torch.float64),
    )
