"""Lab 05 checks against a catalogue of typical mistakes and of correct variants (no nbgrader).

Each wrong implementation must fail the checks that should catch it, with a message naming the
mistake; each correct variant (comparisons of aranges, ``tril``, loops, ``-inf`` with the empty
rows repaired, a float32 softmax for half inputs, lab 02's softmax, a detector that perturbs one
position at a time, one that follows gradients...) must pass every check, visible and hidden.
Calling the kit's answer, PyTorch's mask builder or an attention kernel earns nothing.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from check_support import assert_fails, run_checks

import transformer_lab.attention as attention
import transformer_lab.masks as masks
from transformer_lab.checks import lab05, spec
from transformer_lab.grading.hidden import lab05 as hidden05

CAUSAL_CHECKS = {
    "visible": lab05.check_causal_mask,
    "hidden": lambda fn: hidden05.hidden_check_causal_mask(fn, seed=5101),
}
PADDING_CHECKS = {
    "visible": lab05.check_padding_mask,
    "hidden": lambda fn: hidden05.hidden_check_padding_mask(fn, seed=5201),
}
COMBINE_CHECKS = {
    "visible": lab05.check_combine_masks,
    "hidden": lambda fn: hidden05.hidden_check_combine_masks(fn, seed=5301),
}
ATTENTION_CHECKS = {
    "visible": lab05.check_masked_attention,
    "half": lab05.check_masked_attention_half,
    "hidden": lambda fn: hidden05.hidden_check_masked_attention(fn, seed=5401),
    "dtypes": lambda fn: hidden05.hidden_check_masked_attention_dtypes(fn, seed=5402),
}
DETECTOR_CHECKS = {
    "visible": lab05.check_depends_on_future,
    "hidden": lambda fn: hidden05.hidden_check_depends_on_future(fn, seed=5501),
    "subtle": lambda fn: hidden05.hidden_check_depends_on_future_subtle(fn, seed=5502),
}


# ---------------------------------------------------------------- causal_mask


def causal_arange(T):
    steps = torch.arange(T)
    return steps[None, :] <= steps[:, None]


def causal_tril(T):
    return torch.tril(torch.ones(T, T)).bool()


def causal_loops(T):
    m = torch.zeros(T, T, dtype=torch.bool)
    for t in range(T):
        for s in range(t + 1):
            m[t, s] = True
    return m


def causal_not_triu(T):
    return ~torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)


#: Declared once, as a record of the lab's spec: its wrong code, its hint (tests/test_one_home.py).
UPPER = spec.load("05_masking").mistake("causal causal_upper")
causal_upper = UPPER.wrong_answer()


def causal_one_ahead(T):
    return torch.ones(T, T, dtype=torch.bool).tril(1)


def causal_no_diagonal(T):
    return torch.ones(T, T, dtype=torch.bool).tril(diagonal=-1)


def causal_inverted(T):
    return torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)


def causal_float(T):
    return torch.ones(T, T).tril()


def causal_additive(T):
    return torch.zeros(T, T).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)


def causal_nothing_hidden(T):
    return torch.ones(T, T, dtype=torch.bool)


def causal_extra_axis(T):
    return causal_arange(T)[None]


def causal_kit(T):
    return masks.causal_mask(T)


def causal_torch(T):
    return torch.nn.Transformer.generate_square_subsequent_mask(T) == 0


def not_implemented(*args):
    raise NotImplementedError()


@pytest.mark.parametrize("fn", [causal_arange, causal_tril, causal_loops, causal_not_triu])
def test_correct_causal_masks_pass_every_check(fn) -> None:
    assert run_checks(CAUSAL_CHECKS, fn) == dict.fromkeys(CAUSAL_CHECKS, "")


#: (the mistake, ..., words its messages must contain): the catalogue, also read by test_diagnosis
CAUSAL_MISTAKES = [
    (causal_upper, UPPER.hint.partition(":")[0]),
    (causal_one_ahead, "one step ahead"),
    (causal_no_diagonal, "leaves out the diagonal"),
    (causal_inverted, "inverted"),
    (causal_float, "dtype torch.float32, expected torch.bool"),
    (causal_additive, "dtype torch.float32, expected torch.bool"),
    (causal_nothing_hidden, "nothing is hidden"),
    (causal_extra_axis, "extra leading axis"),
]


@pytest.mark.parametrize(("fn", "words"), CAUSAL_MISTAKES)
def test_causal_mask_mistakes_are_named(fn, words) -> None:
    assert_fails(CAUSAL_CHECKS, fn, ["visible", "hidden"], words)


@pytest.mark.parametrize("fn", [causal_kit, causal_torch])
def test_calling_a_causal_mask_builder_earns_nothing(fn) -> None:
    assert_fails(CAUSAL_CHECKS, fn, ["visible", "hidden"], "does not allow")
    assert masks.causal_mask(3).shape == (3, 3)  # ... and the kit works again afterwards


# ---------------------------------------------------------------- padding_mask


def padding_arange(lengths, max_len):
    lengths = torch.as_tensor(lengths)
    return torch.arange(max_len)[None, :] < lengths[:, None]


def padding_loops(lengths, max_len):
    rows = [[p < int(n) for p in range(max_len)] for n in lengths]
    return torch.tensor(rows, dtype=torch.bool).reshape(len(rows), max_len)


def padding_expand(lengths, max_len):
    lengths = torch.tensor([int(n) for n in lengths])
    return torch.arange(max_len).expand(len(lengths), -1) < lengths.unsqueeze(1)


def padding_inverted(lengths, max_len):
    return ~padding_arange(lengths, max_len)


def padding_off_by_one(lengths, max_len):
    return torch.arange(max_len)[None, :] <= torch.as_tensor(lengths)[:, None]


def padding_from_one(lengths, max_len):
    return torch.arange(1, max_len + 1)[None, :] < torch.as_tensor(lengths)[:, None]


def padding_left(lengths, max_len):
    return padding_arange(lengths, max_len).flip(1)


def padding_transposed(lengths, max_len):
    return padding_arange(lengths, max_len).T


def padding_longest(lengths, max_len):
    lengths = torch.as_tensor(lengths)
    return torch.arange(int(lengths.max()))[None, :] < lengths[:, None]


def padding_float(lengths, max_len):
    return padding_arange(lengths, max_len).float()


def padding_tensors_only(lengths, max_len):
    return torch.arange(max_len)[None, :] < lengths[:, None]


def padding_ignores_lengths(lengths, max_len):
    return torch.ones(len(lengths), max_len, dtype=torch.bool)


def padding_kit(lengths, max_len):
    return masks.padding_mask(lengths, max_len)


@pytest.mark.parametrize("fn", [padding_arange, padding_loops, padding_expand])
def test_correct_padding_masks_pass_every_check(fn) -> None:
    assert run_checks(PADDING_CHECKS, fn) == dict.fromkeys(PADDING_CHECKS, "")


#: (the mistake, ..., words its messages must contain): the catalogue, also read by test_diagnosis
PADDING_MISTAKES = [
    (padding_inverted, "True at the padding"),
    (padding_off_by_one, "one real token too many"),
    (padding_from_one, "start at 1"),
    (padding_left, "left padding"),
    (padding_transposed, "transposed"),
    (padding_longest, "max(lengths) columns"),
    (padding_float, "expected torch.bool"),
    (padding_tensors_only, "torch.as_tensor(lengths)"),
    (padding_ignores_lengths, "lengths are ignored"),
    (padding_kit, "does not allow"),
]


@pytest.mark.parametrize(("fn", "words"), PADDING_MISTAKES)
def test_padding_mask_mistakes_are_named(fn, words) -> None:
    assert_fails(PADDING_CHECKS, fn, ["visible", "hidden"], words)


# ---------------------------------------------------------------- combine_masks


def combine_index(padding, causal):
    return padding[:, None, None, :] & causal


def combine_unsqueeze(padding, causal):
    return torch.logical_and(padding.unsqueeze(1).unsqueeze(2), causal.unsqueeze(0).unsqueeze(0))


def combine_loops(padding, causal):
    B, T = padding.shape
    out = torch.zeros(B, 1, T, T, dtype=torch.bool)
    for b in range(B):
        out[b, 0] = causal & padding[b][None, :]
    return out


def combine_multiply(padding, causal):
    return (padding[:, None, None, :].int() * causal.int()).bool()


def combine_or(padding, causal):
    return padding[:, None, None, :] | causal


def combine_queries(padding, causal):
    return padding[:, None, :, None] & causal


def combine_both(padding, causal):
    return padding[:, None, :, None] & padding[:, None, None, :] & causal


def combine_no_head_axis(padding, causal):
    return padding[:, None, :] & causal


def combine_head_axis_first(padding, causal):
    return (padding[:, None, :] & causal)[None]


def combine_ignores_padding(padding, causal):
    return causal.expand(padding.shape[0], 1, *causal.shape)


def combine_ignores_causal(padding, causal):
    T = padding.shape[1]
    return padding[:, None, None, :].expand(-1, 1, T, T)


def combine_inverted_padding(padding, causal):
    return ~padding[:, None, None, :] & causal


def combine_transposed(padding, causal):
    return padding[:, None, None, :] & causal.T


def combine_own_causal(padding, causal):
    T = padding.shape[1]
    return padding[:, None, None, :] & torch.ones(T, T, dtype=torch.bool).tril()


def combine_float(padding, causal):
    return padding[:, None, None, :].float() * causal.float()


def combine_kit(padding, causal):
    return masks.combine_masks(padding, causal)


@pytest.mark.parametrize("fn", [combine_index, combine_unsqueeze, combine_loops, combine_multiply])
def test_correct_combinations_pass_every_check(fn) -> None:
    assert run_checks(COMBINE_CHECKS, fn) == dict.fromkeys(COMBINE_CHECKS, "")


#: (the mistake, ..., words its messages must contain): the catalogue, also read by test_diagnosis
COMBINE_MISTAKES = [
    (combine_or, ["visible", "hidden"], "| (or)"),
    (combine_queries, ["visible", "hidden"], "hides the rows of padded queries"),
    (combine_both, ["visible", "hidden"], "a query at a padded position still attends"),
    (combine_no_head_axis, ["visible", "hidden"], "no head axis"),
    (combine_head_axis_first, ["visible", "hidden"], "head axis is in the wrong place"),
    (combine_ignores_padding, ["visible", "hidden"], "ignores the padding"),
    (combine_ignores_causal, ["visible", "hidden"], "ignores the causal mask"),
    (combine_inverted_padding, ["visible", "hidden"], "padding mask is inverted"),
    (combine_transposed, ["visible", "hidden"], "causal part is transposed"),
    (combine_own_causal, ["hidden"], "ignores the `causal` argument"),
    (combine_float, ["visible", "hidden"], "expected torch.bool"),
    (combine_kit, ["visible", "hidden"], "does not allow"),
]


@pytest.mark.parametrize(("fn", "failing", "words"), COMBINE_MISTAKES)
def test_combine_masks_mistakes_are_named(fn, failing, words) -> None:
    assert_fails(COMBINE_CHECKS, fn, failing, words)


# ---------------------------------------------------------------- masked_attention


def _scores(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., T, S)


def attention_min_fill(q, k, v, mask):
    s = _scores(q, k).masked_fill(~mask, torch.finfo(q.dtype).min)
    w = torch.softmax(s, dim=-1).masked_fill(~mask, 0.0)
    return w @ v, w


def attention_inf_repaired(q, k, v, mask):
    s = _scores(q, k).masked_fill(~mask, -math.inf)
    w = torch.softmax(s, dim=-1)
    w = torch.where(mask.any(-1, keepdim=True), w, torch.zeros_like(w))
    return w @ v, w


def attention_manual_softmax(q, k, v, mask):
    s = _scores(q, k)
    s = torch.where(mask, s, torch.tensor(torch.finfo(s.dtype).min, dtype=s.dtype))
    e = torch.exp(s - s.amax(-1, keepdim=True)) * mask
    w = e / e.sum(-1, keepdim=True).clamp_min(torch.finfo(e.dtype).tiny)
    return w @ v, w


def attention_softmax_no_max(q, k, v, mask):
    """The dtype's minimum as the fill and masked weights zeroed (right), but the softmax
    written out without the max subtraction: scores far below 0 give 0 / 0 (an empty row is
    0 / 0 as well, but zeroing the masked weights hides it)."""
    s = _scores(q, k).masked_fill(~mask, torch.finfo(q.dtype).min)
    e = torch.exp(s)
    w = (e / e.sum(-1, keepdim=True)).masked_fill(~mask, 0.0)
    return w @ v, w


def attention_float32_inside(q, k, v, mask):
    out, w = attention_min_fill(q.float(), k.float(), v.float(), mask)
    return out.to(q.dtype), w.to(q.dtype)


def attention_lab02_softmax(q, k, v, mask):
    s = torch.einsum("...td,...sd->...ts", q, k) / math.sqrt(q.shape[-1])
    w = attention.softmax(s.masked_fill(~mask, -math.inf), dim=-1)
    return torch.einsum("...ts,...sd->...td", w, v), w


def attention_logsumexp(q, k, v, mask):
    s = ((q / math.sqrt(q.shape[-1])) @ k.transpose(-2, -1)).masked_fill(
        ~mask, torch.finfo(q.dtype).min
    )
    w = torch.exp(s - torch.logsumexp(s, dim=-1, keepdim=True)).masked_fill(~mask, 0.0)
    return w @ v, w


def attention_after_softmax(q, k, v, mask):
    w = torch.softmax(_scores(q, k), dim=-1) * mask
    return w @ v, w


def attention_after_renormalised(q, k, v, mask):
    w = torch.softmax(_scores(q, k), dim=-1) * mask
    w = w / w.sum(-1, keepdim=True).clamp_min(1e-30)
    return w @ v, w


def attention_fill_zero(q, k, v, mask):
    w = torch.softmax(_scores(q, k).masked_fill(~mask, 0.0), dim=-1)
    return w @ v, w


def attention_minus_1e9(q, k, v, mask):
    s = _scores(q, k).masked_fill(~mask, -1e9)
    w = torch.softmax(s, dim=-1).masked_fill(~mask, 0.0)
    return w @ v, w


def attention_minus_1e9_where(q, k, v, mask):
    w = torch.softmax(torch.where(mask, _scores(q, k), -1e9), dim=-1)
    return w @ v, w


def attention_minus_inf(q, k, v, mask):
    w = torch.softmax(_scores(q, k).masked_fill(~mask, -math.inf), dim=-1)
    return w @ v, w


def attention_min_fill_unrepaired(q, k, v, mask):
    w = torch.softmax(_scores(q, k).masked_fill(~mask, torch.finfo(q.dtype).min), dim=-1)
    return w @ v, w


def attention_inverted(q, k, v, mask):
    return attention_min_fill(q, k, v, ~mask)


def attention_ignores_mask(q, k, v, mask):
    w = torch.softmax(_scores(q, k), dim=-1)
    return w @ v, w


def attention_unscaled(q, k, v, mask):
    s = (q @ k.transpose(-2, -1)).masked_fill(~mask, torch.finfo(q.dtype).min)
    w = torch.softmax(s, dim=-1).masked_fill(~mask, 0.0)
    return w @ v, w


def attention_minus_1e4(q, k, v, mask):
    s = _scores(q, k).masked_fill(~mask, -1e4)
    w = torch.softmax(s, dim=-1).masked_fill(~mask, 0.0)
    return w @ v, w


def attention_log_mask(q, k, v, mask):
    s = _scores(q, k) + mask.to(q.dtype).log()
    w = torch.softmax(s, dim=-1).masked_fill(~mask, 0.0)
    return w @ v, w


def attention_unsqueezed_mask(q, k, v, mask):
    return attention_min_fill(q, k, v, mask.unsqueeze(1))


def attention_out_only(q, k, v, mask):
    return attention_min_fill(q, k, v, mask)[0]


def attention_torch(q, k, v, mask):
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out, torch.zeros(*q.shape[:-1], k.shape[-2])


def attention_lab02(q, k, v, mask):
    return attention.scaled_dot_product_attention(q, k, v, mask)


def attention_kit(q, k, v, mask):
    return attention.masked_attention(q, k, v, mask)


@pytest.mark.parametrize(
    "fn",
    [
        attention_min_fill,
        attention_inf_repaired,
        attention_manual_softmax,
        attention_float32_inside,
        attention_lab02_softmax,
        attention_logsumexp,
    ],
)
def test_correct_masked_attention_passes_every_check(fn) -> None:
    assert run_checks(ATTENTION_CHECKS, fn) == dict.fromkeys(ATTENTION_CHECKS, "")


ALL = ["visible", "half", "hidden", "dtypes"]


#: (the mistake, ..., words its messages must contain): the catalogue, also read by test_diagnosis
ATTENTION_MISTAKES = [
    (attention_after_softmax, ALL, "no longer sum to one"),
    (attention_fill_zero, ALL, "set to 0 instead of a very negative number"),
    (attention_minus_1e9, ["half", "dtypes"], "-1e9 does not exist in float16"),
    (
        attention_minus_1e9_where,
        ALL,
        {
            "visible": "uniform weights 1/S",
            "hidden": "uniform weights 1/S",
            "half": "-1e9 becomes -inf in float16",
            "dtypes": "-1e9 becomes -inf in float16",
        },
    ),
    (attention_minus_inf, ALL, "softmax of a row of -inf is 0/0"),
    (attention_softmax_no_max, ["hidden"], "Your softmax overflows"),
    (attention_min_fill_unrepaired, ALL, "uniform weights 1/S"),
    (attention_inverted, ALL, "mask inverted"),
    (attention_ignores_mask, ALL, "mask is ignored"),
    (attention_unscaled, ALL, "without scaling"),
    (attention_minus_1e4, ["hidden"], "not negative enough"),
    (
        attention_after_renormalised,
        ["half", "hidden", "dtypes"],
        {
            "half": "NaN in the rows where the mask allows no key",
            "hidden": "Dividing by the row sums again is no cure",
            "dtypes": "NaN in the rows where the mask allows no key",
        },
    ),
    (attention_log_mask, ["dtypes"], "not finite"),
    (attention_unsqueezed_mask, ALL, "as it is"),
    (attention_out_only, ALL, "should return a pair"),
    (attention_torch, ALL, "does not allow"),
    (attention_lab02, ALL, "does not allow"),
    (attention_kit, ALL, "does not allow"),
]


@pytest.mark.parametrize(("fn", "failing", "words"), ATTENTION_MISTAKES)
def test_masked_attention_mistakes_are_named(fn, failing, words) -> None:
    assert_fails(ATTENTION_CHECKS, fn, failing, words)


def test_the_minus_1e9_mistake_in_float16_names_the_fill_value_when_it_gives_nan() -> None:
    # torch.where turns -1e9 into -inf in float16: the empty row comes out NaN.
    message = run_checks(ATTENTION_CHECKS, attention_minus_1e9_where)["half"]
    assert "-1e9 becomes -inf in float16" in message


def _own_softmax_attention(fill: float, *, repair: bool = True, extra_axis: bool = False):
    """Masked attention with a softmax of its own (lab 02 refuses torch's): ``fill`` for the
    hidden scores, their weights zeroed afterwards when ``repair``, the mask unsqueezed once
    more when ``extra_axis``."""

    def fn(q, k, v, mask):
        mask = mask.unsqueeze(1) if extra_axis else mask
        s = _scores(q, k).masked_fill(~mask, fill)
        e = torch.exp(s - s.amax(-1, keepdim=True))
        w = e / e.sum(-1, keepdim=True)
        w = w.masked_fill(~mask, 0.0) if repair else w
        return w @ v, w

    return fn


@pytest.mark.parametrize(
    ("fn", "words"),
    [
        (_own_softmax_attention(-math.inf, repair=False), "NaN in the rows where the mask allows"),
        (_own_softmax_attention(-1e9), "does not exist in float16 (its range ends at -65504)"),
        (_own_softmax_attention(-6e4, extra_axis=True), "as it is"),
        (
            lambda q, k, v, mask: (q @ k.transpose(-2, -1)) @ v,
            "should return a pair (out, weights)",
        ),
    ],
)
def test_labs_02_and_05_word_the_judges_findings_alike(fn, words) -> None:
    """Masked attention has one judge (``checks/_attention.py``): the same wrong answer given to
    lab 02's ``scaled_dot_product_attention`` check and to lab 05's reads the same there."""
    from transformer_lab.checks import lab02

    checks = {
        "lab02": lab02.check_scaled_dot_product_attention_mask,
        "lab05": lab05.check_masked_attention_half,
    }
    messages = run_checks(checks, fn)
    assert all(words in m for m in messages.values()), messages


def test_masked_keys_have_the_largest_raw_scores_in_the_worked_examples() -> None:
    for name in ("causal", "padded"):
        q, k, v, mask, _ = lab05.attention_example(name)
        scores = _scores(q, k)
        allowed = torch.broadcast_to(mask, scores.shape)
        rows = scores.reshape(-1, scores.shape[-1])  # (B*H*T, S)
        for row, keep in zip(rows, allowed.reshape(rows.shape), strict=True):
            if keep.any() and (~keep).any():
                assert row[~keep].max() > row[keep].max()
        assert q.shape[-2] != k.shape[-2] or name == "causal"
        assert not torch.equal(k[..., : v.shape[-1]], v[..., : k.shape[-1]])
        for t in (q, k, v):  # exact in float16
            assert torch.equal(t.half().float(), t)


# ---------------------------------------------------------------- depends_on_future


def detector_every_cut(fn, x):
    with torch.no_grad():
        before = fn(x)
        for t in range(x.shape[1] - 1):
            changed = x.clone()
            changed[:, t + 1 :] += 1.0 + torch.randn_like(changed[:, t + 1 :])
            if not torch.allclose(fn(changed)[:, : t + 1], before[:, : t + 1]):
                return True
    return False


def detector_one_position_at_a_time(fn, x):
    before = fn(x)
    for s in range(1, x.shape[1]):
        changed = x.clone()
        changed[:, s] = changed[:, s] * -3.0 + 2.0
        if not torch.equal(fn(changed)[:, :s], before[:, :s]):
            return True
    return False


def detector_gradients(fn, x):
    x = x.detach().clone().requires_grad_(True)
    out = fn(x)
    g = torch.Generator().manual_seed(0)
    for t in range(x.shape[1] - 1):
        weights = torch.randn(out[:, : t + 1].shape, generator=g)
        (grad,) = torch.autograd.grad((out[:, : t + 1] * weights).sum(), x, retain_graph=True)
        if bool((grad[:, t + 1 :] != 0).any()):
            return True
    return False


def detector_jacobian(fn, x):
    jac = torch.autograd.functional.jacobian(fn, x)  # out dims + x dims
    T = x.shape[1]
    out_dims = jac.dim() - x.dim()
    for t in range(T - 1):
        block = jac[(slice(None), slice(0, t + 1))]  # outputs at <= t
        block = block[(slice(None),) * out_dims + (slice(None), slice(t + 1, None))]
        if bool((block != 0).any()):
            return True
    return False


def detector_zeros(fn, x):
    with torch.no_grad():
        before = fn(x)
        for t in range(x.shape[1] - 1):
            cut = torch.cat([x[:, : t + 1], torch.zeros_like(x[:, t + 1 :]) + 5.0], dim=1)
            if not torch.equal(fn(cut)[:, : t + 1], before[:, : t + 1]):
                return True
    return False


def detector_numpy(fn, x):
    import numpy as np

    with torch.no_grad():
        before = fn(x).numpy()
        changes = []
        for t in range(x.shape[1] - 1):
            changed = x.clone()
            changed[:, t + 1 :] = -changed[:, t + 1 :] - 2.0
            changes.append(np.abs(fn(changed).numpy()[:, : t + 1] - before[:, : t + 1]).max())
    return np.max(changes) > 0  # a numpy bool


def detector_last_position_only(fn, x):
    changed = x.clone()
    changed[:, -1] += 1.0
    return not torch.allclose(fn(changed)[:, :-1], fn(x)[:, :-1])


def detector_whole_output(fn, x):
    before = fn(x)
    for t in range(x.shape[1] - 1):
        changed = x.clone()
        changed[:, t + 1 :] += 1.0
        if not torch.allclose(fn(changed), before):
            return True
    return False


def detector_includes_t(fn, x):
    before = fn(x)
    for t in range(x.shape[1]):
        changed = x.clone()
        changed[:, t:] += 1.0
        if not torch.allclose(fn(changed)[:, : t + 1], before[:, : t + 1]):
            return True
    return False


def detector_perturbs_past(fn, x):
    before = fn(x)
    for t in range(1, x.shape[1]):
        changed = x.clone()
        changed[:, :t] += 1.0
        if not torch.allclose(fn(changed)[:, t:], before[:, t:]):
            return True
    return False


def detector_one_cut(fn, x):
    t = x.shape[1] // 2
    changed = x.clone()
    changed[:, t + 1 :] += 1.0
    return not torch.allclose(fn(changed)[:, : t + 1], fn(x)[:, : t + 1])


def detector_loose(fn, x):
    before = fn(x)
    for t in range(x.shape[1] - 1):
        changed = x.clone()
        changed[:, t + 1 :] += 1.0
        if not torch.allclose(fn(changed)[:, : t + 1], before[:, : t + 1], atol=1e-2):
            return True
    return False


def detector_in_place(fn, x):
    before = fn(x).clone()
    for t in range(x.shape[1] - 1):
        x[:, t + 1 :] += 1.0
        if not torch.allclose(fn(x)[:, : t + 1], before[:, : t + 1]):
            return True
    return False


def detector_batch_axis(fn, x):
    before = fn(x)
    for t in range(x.shape[0] - 1):
        changed = x.clone()
        changed[t + 1 :] += 1.0
        if not torch.allclose(fn(changed)[: t + 1], before[: t + 1]):
            return True
    return False


def detector_whole_gradient(fn, x):
    x = x.detach().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(fn(x).sum(), x)
    return bool((grad[:, 1:] != 0).any())


def detector_first_output_gradient(fn, x):
    x = x.detach().clone().requires_grad_(True)
    out = fn(x)
    weights = torch.randn(out[:, 0].shape, generator=torch.Generator().manual_seed(0))
    (grad,) = torch.autograd.grad((out[:, 0] * weights).sum(), x)
    return bool((grad[:, 1:] != 0).any())


def detector_forgets_return(fn, x):
    detector_every_cut(fn, x)


def detector_kit(fn, x):
    return masks.depends_on_future(fn, x)


@pytest.mark.parametrize(
    "fn",
    [
        detector_every_cut,
        detector_one_position_at_a_time,
        detector_gradients,
        detector_jacobian,
        detector_zeros,
        detector_numpy,
    ],
)
def test_correct_detectors_pass_every_check(fn) -> None:
    assert run_checks(DETECTOR_CHECKS, fn) == dict.fromkeys(DETECTOR_CHECKS, "")


EVERY = ["visible", "hidden", "subtle"]


DETECTOR_MISTAKES = [
    (detector_last_position_only, ["visible", "subtle"], "every cut"),
    (detector_whole_output, EVERY, "Compare only out[:, :t+1]"),
    (detector_includes_t, EVERY, "never t itself"),
    (detector_perturbs_past, EVERY, "not the other way round"),
    (detector_one_cut, ["visible", "subtle"], "every cut"),
    (detector_loose, ["subtle"], "not atol=1e-2"),
    (detector_in_place, EVERY, "changed x in place"),
    (detector_batch_axis, EVERY, "Time is dim 1"),
    (detector_whole_gradient, EVERY, "Compare only out[:, :t+1]"),
    (detector_first_output_gradient, ["subtle"], "not only the first output"),
    (detector_forgets_return, EVERY, "should return True or False"),
    (detector_kit, EVERY, "does not allow"),
]


@pytest.mark.parametrize(("fn", "failing", "words"), DETECTOR_MISTAKES)
def test_detector_mistakes_are_named(fn, failing, words) -> None:
    assert_fails(DETECTOR_CHECKS, fn, failing, words)


# ---------------------------------------------------------------- all of them


@pytest.mark.parametrize(
    ("checks", "fn"),
    [
        (CAUSAL_CHECKS, not_implemented),
        (PADDING_CHECKS, not_implemented),
        (COMBINE_CHECKS, not_implemented),
        (ATTENTION_CHECKS, not_implemented),
        (DETECTOR_CHECKS, not_implemented),
    ],
)
def test_not_implemented_says_so(checks, fn) -> None:
    outcomes = run_checks(checks, fn)
    assert all("not implemented yet" in msg for msg in outcomes.values()), outcomes


def test_oracles_agree_with_the_package() -> None:
    # The oracles are independent code: they must agree with the kit's implementation.
    assert torch.equal(hidden05.oracle_causal_mask(6), masks.causal_mask(6))
    assert torch.equal(hidden05.oracle_padding_mask([3, 0, 5], 5), masks.padding_mask([3, 0, 5], 5))
    pad = masks.padding_mask([4, 2, 1], 4)
    assert torch.equal(
        hidden05.oracle_combine_masks(pad, masks.causal_mask(4)),
        masks.combine_masks(pad, masks.causal_mask(4)),
    )
    for name in ("causal", "padded"):
        q, k, v, mask, _ = lab05.attention_example(name)
        want_out, want_w = hidden05.attend64(q, k, v, mask)
        out, w = attention.masked_attention(q.double(), k.double(), v.double(), mask)
        torch.testing.assert_close(w, want_w)
        torch.testing.assert_close(out, want_out)


def test_fixtures_are_what_the_hidden_module_computes() -> None:
    from transformer_lab.grading.fixtures import check_fixtures

    assert check_fixtures(Path(__file__).resolve().parents[1], ["05_masking"]) == []
