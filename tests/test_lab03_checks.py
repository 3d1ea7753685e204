"""Lab 03 checks against a catalogue of typical mistakes and of correct variants (no nbgrader).

Each wrong implementation must fail exactly the checks that should catch it, with a message that
names the mistake; each correct variant (views or chunks, einsum, loops over heads, its own
softmax, ``-inf`` fills repaired, float32 arithmetic inside a float16 module, a dropout of 0,
several ways of copying weights) must pass every check, visible and hidden. The visible checks
live in ``transformer_lab/checks/lab03.py``, the hidden ones and their oracles in
``transformer_lab/grading/hidden/lab03.py``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from check_support import assert_fails, run_checks
from torch import nn

from transformer_lab import attention as kit
from transformer_lab.checks import lab03
from transformer_lab.checks._attention import stored_pair
from transformer_lab.checks._common import stored
from transformer_lab.grading.hidden import lab03 as hidden03

SPLIT = {
    "visible": lab03.check_split_heads,
    "divisible": lab03.check_split_heads_divisible,
    "hidden": lambda f: hidden03.hidden_check_split_heads(f, seed=3101),
}
MERGE = {
    "visible": lab03.check_merge_heads,
    "hidden": lambda f: hidden03.hidden_check_merge_heads(f, seed=3201),
}
MHA = {
    "visible": lab03.check_multi_head_attention,
    "divisible": lab03.check_multi_head_attention_divisible,
    "mask": lab03.check_multi_head_attention_mask,
    "hidden": lambda c: hidden03.hidden_check_multi_head_attention(c, seed=3301),
    "hidden_mask": lambda c: hidden03.hidden_check_multi_head_attention_mask(c, seed=3302),
    "dtypes": lambda c: hidden03.hidden_check_multi_head_attention_dtypes(c, seed=3303),
}


# ------------------------------------------------------------------------ split_heads


def split_heads(x, n_heads):
    B, T, D = x.shape
    if D % n_heads:
        raise ValueError(f"d_model={D} is not divisible by n_heads={n_heads}")
    return x.view(B, T, n_heads, D // n_heads).transpose(1, 2)  # (B, H, T, Dh)


def split_chunks(x, n_heads):
    D = x.shape[-1]
    if D % n_heads != 0:
        raise ValueError(f"cannot split width {D} into {n_heads} heads")
    return torch.stack(x.chunk(n_heads, dim=-1), dim=1)  # (B, H, T, Dh)


def split_unflatten(x, n_heads):
    if x.shape[-1] % n_heads:
        raise ValueError(f"{x.shape[-1]} features, {n_heads} heads: not divisible")
    return x.unflatten(-1, (n_heads, -1)).permute(0, 2, 1, 3)


def split_loop(x, n_heads):
    B, T, D = x.shape
    if D % n_heads:
        raise ValueError(f"d_model={D}, n_heads={n_heads}")
    dh = D // n_heads
    out = torch.empty(B, n_heads, T, dh, dtype=x.dtype)
    for h in range(n_heads):
        out[:, h] = x[:, :, h * dh : (h + 1) * dh]
    return out


def split_no_transpose(x, n_heads):
    B, T, D = x.shape
    if D % n_heads:
        raise ValueError(f"d_model={D} is not divisible by n_heads={n_heads}")
    return x.reshape(B, n_heads, T, D // n_heads)


def split_interleaved(x, n_heads):
    B, T, D = x.shape
    if D % n_heads:
        raise ValueError(f"d_model={D} is not divisible by n_heads={n_heads}")
    return x.reshape(B, T, D // n_heads, n_heads).permute(0, 3, 1, 2)


def split_head_axis_left(x, n_heads):
    B, T, D = x.shape
    if D % n_heads:
        raise ValueError(f"d_model={D} is not divisible by n_heads={n_heads}")
    return x.view(B, T, n_heads, D // n_heads)


def split_no_check(x, n_heads):
    B, T, D = x.shape
    return x.view(B, T, n_heads, D // n_heads).transpose(1, 2)


def split_vague_error(x, n_heads):
    if x.shape[-1] % n_heads:
        raise ValueError("n_heads must divide d_model")
    return split_heads(x, n_heads)


def split_assert(x, n_heads):
    assert x.shape[-1] % n_heads == 0, "heads must divide the width"
    return split_heads(x, n_heads)


def split_casts_to_float(x, n_heads):
    return split_heads(x, n_heads).float()


def split_kit(x, n_heads):
    return kit.split_heads(x, n_heads)


def split_not_implemented(x, n_heads):
    raise NotImplementedError()


@pytest.mark.parametrize("fn", [split_heads, split_chunks, split_unflatten, split_loop])
def test_correct_splits_pass_every_check(fn) -> None:
    assert run_checks(SPLIT, fn) == dict.fromkeys(SPLIT, "")


SPLIT_MISTAKES = [
    (split_no_transpose, ["visible", "hidden"], "then transpose(1, 2)"),
    (split_interleaved, ["visible", "hidden"], "interleaved"),
    (split_head_axis_left, ["visible", "hidden"], "the sizes are right but in the wrong order"),
    (split_no_check, ["divisible"], "raised RuntimeError"),
    (split_vague_error, ["divisible"], "raised ValueError('n_heads must divide d_model')"),
    (split_assert, ["divisible"], "raised AssertionError"),
    (split_casts_to_float, ["hidden"], "keep the input's dtype"),
    (split_kit, ["visible", "divisible", "hidden"], "does not allow"),
    (split_not_implemented, ["visible", "divisible", "hidden"], "not implemented yet"),
]


@pytest.mark.parametrize(("fn", "failing", "words"), SPLIT_MISTAKES)
def test_split_mistakes_fail_with_a_message_naming_them(fn, failing, words) -> None:
    assert_fails(SPLIT, fn, failing, words, ignore_case=True)


# ------------------------------------------------------------------------ merge_heads


def merge_heads(x):
    B, H, T, Dh = x.shape
    return x.transpose(1, 2).reshape(B, T, H * Dh)  # (B, T, D)


def merge_cat(x):
    return torch.cat(x.unbind(1), dim=-1)  # (B, T, H*Dh)


def merge_permute_flatten(x):
    return x.permute(0, 2, 1, 3).flatten(2)


def merge_contiguous_view(x):
    B, H, T, Dh = x.shape
    return x.transpose(1, 2).contiguous().view(B, T, H * Dh)


def merge_no_transpose(x):
    B, H, T, Dh = x.shape
    return x.reshape(B, T, H * Dh)


def merge_view(x):
    B, H, T, Dh = x.shape
    return x.transpose(1, 2).view(B, T, H * Dh)


def merge_interleaved(x):
    B, H, T, Dh = x.shape
    return x.permute(0, 2, 3, 1).reshape(B, T, H * Dh)


def merge_not_flat(x):
    return x.transpose(1, 2)


def merge_wrong_axes(x):
    B, H, T, Dh = x.shape
    return x.transpose(2, 3).reshape(B, T, H * Dh)


def merge_kit(x):
    return kit.merge_heads(x)


def merge_not_implemented(x):
    raise NotImplementedError()


@pytest.mark.parametrize(
    "fn", [merge_heads, merge_cat, merge_permute_flatten, merge_contiguous_view]
)
def test_correct_merges_pass_every_check(fn) -> None:
    assert run_checks(MERGE, fn) == dict.fromkeys(MERGE, "")


MERGE_MISTAKES = [
    (merge_no_transpose, ["visible", "hidden"], "no transpose"),
    (merge_view, ["visible", "hidden"], "view size is not compatible"),
    (merge_interleaved, ["visible", "hidden"], "interleaved"),
    (merge_not_flat, ["visible", "hidden"], "there is an extra dimension"),
    (merge_wrong_axes, ["visible", "hidden"], "transpose(2, 3)"),
    (merge_kit, ["visible", "hidden"], "transformer_lab.attention.merge_heads"),
    (merge_not_implemented, ["visible", "hidden"], "not implemented yet"),
]


@pytest.mark.parametrize(("fn", "failing", "words"), MERGE_MISTAKES)
def test_merge_mistakes_fail_with_a_message_naming_them(fn, failing, words) -> None:
    assert_fails(MERGE, fn, failing, words, ignore_case=True)


# ------------------------------------------------------------------------ MultiHeadAttention


def _masked_softmax(scores, mask, fill=None):
    """Softmax over the keys; blocked keys get exactly 0, empty rows are all 0."""
    if mask is not None:
        fill = torch.finfo(scores.dtype).min if fill is None else fill
        scores = scores.masked_fill(~mask, fill)
    w = torch.exp(scores - scores.amax(-1, keepdim=True))
    w = w / w.sum(-1, keepdim=True)
    return w if mask is None else w * mask


class Reference(nn.Module):
    """Split, lab 02's attention from the kit, merge, project."""

    def __init__(self, d_model, n_heads, bias=True):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def heads(self, x):
        return split_heads(x, self.n_heads)

    def merge(self, x):
        return merge_heads(x)

    def attend(self, q, k, v, mask):
        return kit.scaled_dot_product_attention(q, k, v, mask)

    def inputs(self, query, key, value):
        return query, key, value

    def forward(self, query, key, value, mask=None):
        query, key, value = self.inputs(query, key, value)
        q = self.heads(self.q_proj(query))
        k = self.heads(self.k_proj(key))
        v = self.heads(self.v_proj(value))
        out, w = self.attend(q, k, v, mask)
        return self.out_proj(self.merge(out)), w


class Einsum(Reference):
    """Einsum over named axes with its own masked softmax (finfo.min fill, zeroed)."""

    def forward(self, query, key, value, mask=None):
        H = self.n_heads
        B, T, D = query.shape
        S = key.shape[1]
        q = self.q_proj(query).view(B, T, H, D // H)
        k = self.k_proj(key).view(B, S, H, D // H)
        v = self.v_proj(value).view(B, S, H, D // H)
        scores = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(D // H)
        w = _masked_softmax(scores, mask)
        out = torch.einsum("bhts,bshd->bthd", w, v).reshape(B, T, D)
        return self.out_proj(out), w


class LoopOverHeads(Reference):
    """One head at a time with torch.softmax and a -inf fill repaired by nan_to_num."""

    def forward(self, query, key, value, mask=None):
        H = self.n_heads
        D = query.shape[-1]
        dh = D // H
        q, k, v = self.q_proj(query), self.k_proj(key), self.v_proj(value)
        full = None
        if mask is not None:
            full = torch.broadcast_to(mask, (q.shape[0], H, q.shape[1], k.shape[1]))
        outs, weights = [], []
        for h in range(H):
            cols = slice(h * dh, (h + 1) * dh)
            scores = q[..., cols] @ k[..., cols].transpose(1, 2) / dh**0.5
            if full is not None:
                scores = scores.masked_fill(~full[:, h], float("-inf"))
            w = torch.softmax(scores, dim=-1).nan_to_num(0.0)
            outs.append(w @ v[..., cols])
            weights.append(w)
        return self.out_proj(torch.cat(outs, dim=-1)), torch.stack(weights, dim=1)


class LogSumExp(Reference):
    """Softmax written as exp(s - logsumexp(s)), weights of blocked keys zeroed."""

    def attend(self, q, k, v, mask):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        w = torch.exp(scores - torch.logsumexp(scores, dim=-1, keepdim=True))
        if mask is not None:
            w = w.masked_fill(~mask, 0.0)
        return w @ v, w


class Float32Inside(Reference):
    """Scores and softmax in float32 whatever the module's dtype, cast back before merging."""

    def attend(self, q, k, v, mask):
        out, w = kit.scaled_dot_product_attention(q.float(), k.float(), v.float(), mask)
        return out.to(q.dtype), w.to(q.dtype)


class KitSoftmax(Reference):
    """Lab 02's softmax from the kit, and a -1e4 fill (fits float16) with blocked keys zeroed."""

    def attend(self, q, k, v, mask):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(~mask, -1e4)
        w = kit.softmax(scores, dim=-1)
        if mask is not None:
            w = w * mask
        return w @ v, w


class WithZeroDropout(Reference):
    """An optional dropout argument (default 0) on the weights: train and eval agree."""

    def __init__(self, d_model, n_heads, bias=True, dropout=0.0):
        super().__init__(d_model, n_heads, bias)
        self.drop = nn.Dropout(dropout)

    def attend(self, q, k, v, mask):
        _, w = kit.scaled_dot_product_attention(q, k, v, mask)
        return self.drop(w) @ v, w


@pytest.mark.parametrize(
    "cls",
    [Reference, Einsum, LoopOverHeads, LogSumExp, Float32Inside, KitSoftmax, WithZeroDropout],
)
def test_correct_attention_modules_pass_every_check(cls) -> None:
    assert run_checks(MHA, cls) == dict.fromkeys(MHA, "")


class NoOutProj(Reference):
    def forward(self, query, key, value, mask=None):
        q, k, v = (self.heads(p(t)) for p, t in ((self.q_proj, query), (self.k_proj, key),
                                                   (self.v_proj, value)))  # fmt: skip
        out, w = self.attend(q, k, v, mask)
        return self.merge(out), w


def _scaled(scale_of: Callable[[int, int], float]) -> type:
    class Scaled(Reference):
        def attend(self, q, k, v, mask):
            D = q.shape[-1] * q.shape[1]
            scores = q @ k.transpose(-2, -1) * scale_of(q.shape[-1], D)
            w = _masked_softmax(scores, mask)
            return w @ v, w

    return Scaled


ScaleDModel = _scaled(lambda dh, d: 1 / math.sqrt(d))
ScaleDModel.__name__ = "ScaleDModel"
NoScale = _scaled(lambda dh, d: 1.0)
NoScale.__name__ = "NoScale"


class SplitNoTranspose(Reference):
    def heads(self, x):
        B, T, D = x.shape
        return x.reshape(B, self.n_heads, T, D // self.n_heads)


class MergeNoTranspose(Reference):
    def merge(self, x):
        return merge_no_transpose(x)


class ValuesFromKey(Reference):
    def inputs(self, query, key, value):
        return query, key, key


class KeysFromValue(Reference):
    def inputs(self, query, key, value):
        return query, value, value


class KeyValueSwapped(Reference):
    def inputs(self, query, key, value):
        return query, value, key


class KeysFromQuery(Reference):
    """The self-attention habit: keys and values from the query."""

    def inputs(self, query, key, value):
        return query, query, query


class MaskIgnored(Reference):
    def attend(self, q, k, v, mask):
        return kit.scaled_dot_product_attention(q, k, v, None)


class MaskInverted(Reference):
    def attend(self, q, k, v, mask):
        return kit.scaled_dot_product_attention(q, k, v, None if mask is None else ~mask)


class MaskAfterSoftmax(Reference):
    def attend(self, q, k, v, mask):
        _, w = kit.scaled_dot_product_attention(q, k, v, None)
        if mask is not None:
            w = w * mask
        return w @ v, w


class MaskNegInf(Reference):
    def attend(self, q, k, v, mask):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        w = torch.softmax(scores, dim=-1)
        return w @ v, w


class MaskUniformEmptyRows(Reference):
    """A finite fill and nothing zeroed: a query with no allowed key averages every key."""

    def attend(self, q, k, v, mask):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        w = torch.softmax(scores, dim=-1)
        return w @ v, w


class MaskFillMinus1e9(Reference):
    """Right in float32; -1e9 does not fit in float16."""

    def attend(self, q, k, v, mask):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(~mask, -1e9)
        w = torch.softmax(scores, dim=-1)
        if mask is not None:
            w = w * mask
        return w @ v, w


class MaskUnsqueezed(Reference):
    """Assumes (B, T, S) masks and adds the head axis."""

    def attend(self, q, k, v, mask):
        return kit.scaled_dot_product_attention(q, k, v, None if mask is None else mask[:, None])


class MaskRepeatedWrongly(Reference):
    """Flattens heads into the batch as b*H + h, but repeats the mask in the order h*B + b."""

    def attend(self, q, k, v, mask):
        B, H, T, Dh = q.shape
        S = k.shape[2]
        qf, kf, vf = (t.reshape(B * H, -1, Dh) for t in (q, k, v))
        m = None
        if mask is not None:
            m = torch.broadcast_to(mask, (B, H, T, S))[:, :1]  # one mask per example
            m = m.reshape(B, T, S).repeat(H, 1, 1)  # (H*B, T, S): the wrong order
        out, w = kit.scaled_dot_product_attention(qf, kf, vf, m)
        return out.view(B, H, T, Dh), w.view(B, H, T, S)


class MaskFirstHeadOnly(Reference):
    """Assumes one mask for all heads: a (B, H, T, S) mask is cut to its first head."""

    def attend(self, q, k, v, mask):
        if mask is not None and mask.dim() == 4:
            mask = mask[:, :1]
        return kit.scaled_dot_product_attention(q, k, v, mask)


class AlwaysBias(Reference):
    def __init__(self, d_model, n_heads, bias=True):
        super().__init__(d_model, n_heads, bias=True)


class NoDivisibilityCheck(Reference):
    def __init__(self, d_model, n_heads, bias=True):
        nn.Module.__init__(self)
        self.n_heads = n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)


class PerHeadLinears(Reference):
    """Adds a projection per head on top of the shared ones: extra parameters."""

    def __init__(self, d_model, n_heads, bias=True):
        super().__init__(d_model, n_heads, bias)
        self.head_proj = nn.ModuleList(
            nn.Linear(d_model // n_heads, d_model // n_heads) for _ in range(n_heads)
        )


class AveragedWeights(Reference):
    def forward(self, query, key, value, mask=None):
        out, w = super().forward(query, key, value, mask)
        return out, w.mean(1)


class DropoutOnWeights(Reference):
    """nn.Dropout(0.1) on the weights: training mode differs from eval mode."""

    def __init__(self, d_model, n_heads, bias=True):
        super().__init__(d_model, n_heads, bias)
        self.drop = nn.Dropout(0.1)

    def attend(self, q, k, v, mask):
        _, w = kit.scaled_dot_product_attention(q, k, v, mask)
        return self.drop(w) @ v, w


class ForwardWithoutGrad(Reference):
    @torch.no_grad()
    def forward(self, query, key, value, mask=None):
        return super().forward(query, key, value, mask)


class DetachedQueries(Reference):
    """The queries are cut off from the graph: right values, but q_proj never learns."""

    def forward(self, query, key, value, mask=None):
        q = self.heads(self.q_proj(query)).detach()
        k, v = self.heads(self.k_proj(key)), self.heads(self.v_proj(value))
        out, w = self.attend(q, k, v, mask)
        return self.out_proj(self.merge(out)), w


class WrapsTorch(Reference):
    def __init__(self, d_model, n_heads, bias=True):
        super().__init__(d_model, n_heads, bias)
        self.inner = nn.MultiheadAttention(d_model, n_heads, bias=bias, batch_first=True)

    def forward(self, query, key, value, mask=None):
        return self.inner(query, key, value, attn_mask=None if mask is None else ~mask)


class TorchSDPA(Reference):
    def attend(self, q, k, v, mask):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out, torch.zeros(*q.shape[:-1], k.shape[-2])


class FunctionalMHA(Reference):
    """torch.nn.functional.multi_head_attention_forward with the module's own weights."""

    def forward(self, query, key, value, mask=None):
        D = query.shape[-1]
        biases = [p.bias for p in (self.q_proj, self.k_proj, self.v_proj)]
        out, w = F.multi_head_attention_forward(
            *(t.transpose(0, 1) for t in (query, key, value)), D, self.n_heads, None,
            None if biases[0] is None else torch.cat(biases), None, None, False, 0.0,
            self.out_proj.weight, self.out_proj.bias, training=False,
            attn_mask=None if mask is None else ~mask, use_separate_proj_weight=True,
            q_proj_weight=self.q_proj.weight, k_proj_weight=self.k_proj.weight,
            v_proj_weight=self.v_proj.weight, average_attn_weights=False,
        )  # fmt: skip
        return out.transpose(0, 1), w


class NotImplementedModule(nn.Module):
    """The release's stub: __init__ stops at `raise NotImplementedError()`."""

    def __init__(self, d_model, n_heads, bias=True):
        super().__init__()
        raise NotImplementedError()


class WrapsKit(Reference):
    def forward(self, query, key, value, mask=None):
        return kit.MultiHeadAttention.forward(self, query, key, value, mask)


VALUES = ["visible", "mask", "hidden", "hidden_mask", "dtypes"]
MASKS = ["mask", "hidden_mask", "dtypes"]
ALL = list(MHA)
#: Keys from the query give scores (B, H, T, T) that a key mask does not broadcast to.
BROADCAST = {"mask": "does not broadcast", "hidden_mask": "does not broadcast"}


ATTENTION_MISTAKES = [
    (NoOutProj, VALUES, "without the output projection"),
    (ScaleDModel, VALUES, "sqrt(d_model)"),
    (NoScale, VALUES, "without scaling"),
    (SplitNoTranspose, VALUES, "reshape(B, H, T, Dh)"),
    (MergeNoTranspose, VALUES, "no transpose"),
    (ValuesFromKey, VALUES, "values computed from `key`"),
    (KeysFromValue, VALUES, "keys computed from `value`"),
    (KeyValueSwapped, VALUES, "keys and values swapped"),
    (KeysFromQuery, VALUES, dict.fromkeys(VALUES, "(B, H, T_q, T_k)") | BROADCAST),
    (MaskIgnored, MASKS, "without the mask"),
    (MaskInverted, MASKS, "mask inverted"),
    (MaskAfterSoftmax, MASKS, "after the softmax"),
    (MaskNegInf, MASKS, "-inf"),
    (MaskUniformEmptyRows, MASKS, "attend to nothing"),
    (MaskFillMinus1e9, ["mask", "dtypes"], "finfo(scores.dtype).min"),
    (MaskUnsqueezed, MASKS, "does not broadcast"),
    (MaskRepeatedWrongly, MASKS, "line up with the batch axis"),
    (MaskFirstHeadOnly, ["mask", "hidden_mask"], "follows the mask of head"),
    (AlwaysBias, ["visible", "hidden"], "parameters, expected 4 * d_model * (d_model) ="),
    (NoDivisibilityCheck, ["divisible"], "returned normally instead of a ValueError"),
    (PerHeadLinears, ["visible", "mask", "hidden"], "parameters"),
    (AveragedWeights, VALUES, "(B, H, T_q, T_k)"),
    (DropoutOnWeights, ["visible", "hidden", "hidden_mask"], "no dropout"),
    (ForwardWithoutGrad, ["visible", "hidden"], "no gradient reaches q_proj.weight"),
    (DetachedQueries, ["visible", "hidden"], "no gradient reaches q_proj.weight"),
    (WrapsTorch, VALUES, "torch.nn.MultiheadAttention"),
    (TorchSDPA, VALUES, "scaled_dot_product_attention"),
    (FunctionalMHA, VALUES, "multi_head_attention_forward"),
    (WrapsKit, VALUES, "does not allow"),
    (NotImplementedModule, ALL, "not implemented yet"),
]


@pytest.mark.parametrize(
    ("cls", "failing", "words"), ATTENTION_MISTAKES, ids=lambda v: getattr(v, "__name__", None)
)
def test_attention_mistakes_fail_with_a_message_naming_them(cls, failing, words) -> None:
    assert_fails(MHA, cls, failing, words, ignore_case=True)


# ------------------------------------------------------------------------ load_torch_weights

LOAD = {
    "visible": lab03.check_load_torch_weights,
    "hidden": lambda f: hidden03.hidden_check_load_torch_weights(f, Reference, seed=3401),
}
_IN = ("q_proj", "k_proj", "v_proj")


def _layers(ours):
    return [getattr(ours, n) for n in _IN]


@torch.no_grad()
def load_torch_weights(ours, theirs):
    D = theirs.embed_dim
    for lin, w in zip(_layers(ours), theirs.in_proj_weight.split(D), strict=True):
        lin.weight.copy_(w)
    ours.out_proj.weight.copy_(theirs.out_proj.weight)
    if theirs.in_proj_bias is not None:
        for lin, b in zip(_layers(ours), theirs.in_proj_bias.chunk(3), strict=True):
            lin.bias.copy_(b)
        ours.out_proj.bias.copy_(theirs.out_proj.bias)


def load_state_dicts(ours, theirs):
    """Through load_state_dict: copies into the existing parameters."""
    ws = theirs.in_proj_weight.detach().chunk(3)
    bs = (None,) * 3 if theirs.in_proj_bias is None else theirs.in_proj_bias.detach().chunk(3)
    for lin, w, b in zip(_layers(ours), ws, bs, strict=True):
        lin.load_state_dict({"weight": w} | ({} if b is None else {"bias": b}))
    ours.out_proj.load_state_dict(theirs.out_proj.state_dict())


def load_data_copy(ours, theirs):
    """Through .data (no no_grad needed), row by row."""
    D = theirs.embed_dim
    for i, lin in enumerate(_layers(ours)):
        for r in range(D):
            lin.weight.data[r].copy_(theirs.in_proj_weight.data[i * D + r])
        if lin.bias is not None:
            lin.bias.data.copy_(theirs.in_proj_bias.data[i * D : (i + 1) * D])
    ours.out_proj.weight.data.copy_(theirs.out_proj.weight.data)
    if ours.out_proj.bias is not None:
        ours.out_proj.bias.data.copy_(theirs.out_proj.bias.data)


@torch.no_grad()
def load_wrong_order(ours, theirs):
    k, q, v = theirs.in_proj_weight.chunk(3)
    for lin, w in zip(_layers(ours), (q, k, v), strict=True):
        lin.weight.copy_(w)
    ours.out_proj.weight.copy_(theirs.out_proj.weight)
    if theirs.in_proj_bias is not None:
        for lin, b in zip(_layers(ours), theirs.in_proj_bias.chunk(3), strict=True):
            lin.bias.copy_(b)
        ours.out_proj.bias.copy_(theirs.out_proj.bias)


@torch.no_grad()
def load_transposed(ours, theirs):
    for lin, w in zip(_layers(ours), theirs.in_proj_weight.chunk(3), strict=True):
        lin.weight.copy_(w.T)
    ours.out_proj.weight.copy_(theirs.out_proj.weight.T)
    if theirs.in_proj_bias is not None:
        for lin, b in zip(_layers(ours), theirs.in_proj_bias.chunk(3), strict=True):
            lin.bias.copy_(b)
        ours.out_proj.bias.copy_(theirs.out_proj.bias)


@torch.no_grad()
def load_no_bias(ours, theirs):
    for lin, w in zip(_layers(ours), theirs.in_proj_weight.chunk(3), strict=True):
        lin.weight.copy_(w)
    ours.out_proj.weight.copy_(theirs.out_proj.weight)


@torch.no_grad()
def load_no_out_proj(ours, theirs):
    for lin, w in zip(_layers(ours), theirs.in_proj_weight.chunk(3), strict=True):
        lin.weight.copy_(w)
    if theirs.in_proj_bias is not None:
        for lin, b in zip(_layers(ours), theirs.in_proj_bias.chunk(3), strict=True):
            lin.bias.copy_(b)


@torch.no_grad()
def load_assumes_bias(ours, theirs):
    for lin, w, b in zip(
        _layers(ours), theirs.in_proj_weight.chunk(3), theirs.in_proj_bias.chunk(3), strict=True
    ):
        lin.weight.copy_(w)
        lin.bias.copy_(b)
    ours.out_proj.weight.copy_(theirs.out_proj.weight)
    ours.out_proj.bias.copy_(theirs.out_proj.bias)


def load_new_parameters(ours, theirs):
    """Replaces the Parameters: right values, but an optimizer built before still holds the old."""
    ws = theirs.in_proj_weight.detach().chunk(3)
    for lin, w in zip(_layers(ours), ws, strict=True):
        lin.weight = nn.Parameter(w.clone())
    ours.out_proj.weight = nn.Parameter(theirs.out_proj.weight.detach().clone())
    if theirs.in_proj_bias is not None:
        for lin, b in zip(_layers(ours), theirs.in_proj_bias.detach().chunk(3), strict=True):
            lin.bias = nn.Parameter(b.clone())
        ours.out_proj.bias = nn.Parameter(theirs.out_proj.bias.detach().clone())


def load_new_linears(ours, theirs):
    """Builds new nn.Linear layers holding torch's values."""
    D = theirs.embed_dim
    bias = theirs.in_proj_bias is not None
    fresh = {n: nn.Linear(D, D, bias=bias) for n in lab03.PROJECTIONS}
    for name, lin in fresh.items():
        setattr(ours, name, lin)
    load_torch_weights(ours, theirs)


def load_plain_tensor(ours, theirs):
    load_torch_weights(ours, theirs)
    w = ours.q_proj.weight.detach().clone()
    del ours.q_proj.weight
    ours.q_proj.weight = w


def load_shares_memory(ours, theirs):
    """Points .data at torch's own tensors: the same objects, but one memory for two modules."""
    D = theirs.embed_dim
    for i, lin in enumerate(_layers(ours)):
        lin.weight.data = theirs.in_proj_weight.data[i * D : (i + 1) * D]
        if lin.bias is not None:
            lin.bias.data = theirs.in_proj_bias.data[i * D : (i + 1) * D]
    ours.out_proj.weight.data = theirs.out_proj.weight.data
    if ours.out_proj.bias is not None:
        ours.out_proj.bias.data = theirs.out_proj.bias.data


def load_without_no_grad(ours, theirs):
    for lin, w in zip(_layers(ours), theirs.in_proj_weight.chunk(3), strict=True):
        lin.weight.copy_(w)


def load_freezes(ours, theirs):
    load_torch_weights(ours, theirs)
    for lin in _layers(ours):
        lin.weight.requires_grad_(False)


def load_kit(ours, theirs):
    kit.load_torch_weights(ours, theirs)


def load_not_implemented(ours, theirs):
    raise NotImplementedError()


@pytest.mark.parametrize("fn", [load_torch_weights, load_state_dicts, load_data_copy])
def test_correct_loaders_pass_every_check(fn) -> None:
    assert run_checks(LOAD, fn) == dict.fromkeys(LOAD, "")


LOAD_MISTAKES = [
    (load_wrong_order, ["visible", "hidden"], "order query, key, value"),
    (load_transposed, ["visible", "hidden"], "without .T"),
    (load_no_bias, ["visible", "hidden"], "q_proj.bias was not filled"),
    (load_no_out_proj, ["visible", "hidden"], "out_proj.weight was not filled"),
    (load_assumes_bias, ["hidden"], "bias=False"),
    (load_new_parameters, ["visible", "hidden"], "optimizer built before loading"),
    (load_new_linears, ["visible", "hidden"], "must be the trainable Parameter it was"),
    (load_plain_tensor, ["visible", "hidden"], "copy the values into it"),
    (load_shares_memory, ["visible", "hidden"], "in memory of its own"),
    (load_without_no_grad, ["visible", "hidden"], "torch.no_grad()"),
    (load_freezes, ["visible", "hidden"], "must be the trainable Parameter"),
    (load_kit, ["visible", "hidden"], "transformer_lab.attention.load_torch_weights"),
    (load_not_implemented, ["visible", "hidden"], "not implemented yet"),
]


@pytest.mark.parametrize(("fn", "failing", "words"), LOAD_MISTAKES)
def test_load_mistakes_fail_with_a_message_naming_them(fn, failing, words) -> None:
    assert_fails(LOAD, fn, failing, words, ignore_case=True)


def test_the_load_check_uses_the_students_module() -> None:
    hidden03.hidden_check_load_torch_weights(load_torch_weights, Einsum, seed=3)
    with pytest.raises(AssertionError, match="output projection"):
        hidden03.hidden_check_load_torch_weights(load_torch_weights, NoOutProj, seed=3)


# ------------------------------------------------------------------------ the checks themselves


def test_the_oracle_agrees_with_torch_and_the_kit() -> None:
    g = torch.Generator().manual_seed(0)
    theirs = nn.MultiheadAttention(12, 3, batch_first=True).eval()
    ours = kit.MultiHeadAttention(12, 3).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / 3)
    kit.load_torch_weights(ours, theirs)
    q, k, v = torch.randn(2, 4, 12), torch.randn(2, 6, 12), torch.randn(2, 6, 12)
    mask = torch.rand(2, 1, 4, 6, generator=g) < 0.6
    mask[..., 0] = True
    with torch.no_grad():
        ref_out, ref_w = theirs(
            q, k, v, attn_mask=~mask.expand(2, 3, 4, 6).reshape(6, 4, 6), average_attn_weights=False
        )
        kit_out, kit_w = ours(q, k, v, mask)
    out, w = hidden03.oracle_multi_head_attention(hidden03.params_of(ours), (q, k, v, mask), 3)
    for got, want in ((out, ref_out), (w, ref_w), (out, kit_out), (w, kit_w)):
        torch.testing.assert_close(got, want.double(), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(hidden03.heads_split_as(q, 3), kit.split_heads(q, 3), atol=0, rtol=0)


def test_stored_masks_block_the_top_key_of_every_row_and_mistakes_stand_out() -> None:
    """The blocked keys out-score the allowed ones, and each stored mistake is far off."""
    names = ["query", "key", *(f"{p}.{a}" for p in lab03.PROJECTIONS for a in lab03.ATTRS)]
    example = {n: stored("lab03", f"MultiHeadAttention(8, 2) example: {n}")[0] for n in names}
    p = {k: v for k, v in example.items() if "." in k}
    scores = hidden03.scores_of(p, example["query"], example["key"], 2)  # (B, H, T, S)
    for label in ("a (B, 1, 1, S) key mask", "a (B, H, T, S) mask with an empty row"):
        key = f"MultiHeadAttention(8, 2) example with {label}"
        mask = stored("lab03", f"{key}: mask")[0].bool().expand_as(scores)
        top = scores.argmax(-1, keepdim=True)
        assert not mask.gather(-1, top).any()
        assert (~mask).all(-1).any() == (label.endswith("empty row"))
        (want_out, want_w), mistakes = stored_pair("lab03", key)
        assert len(mistakes) >= 8
        for out, w in mistakes.values():
            gap = max(
                float((out - want_out).abs().nan_to_num(1.0).max()),
                float((w - want_w).abs().nan_to_num(1.0).max()) if w.shape == want_w.shape else 1,
            )
            assert gap > 5 * lab03.TOLERANCE[torch.float16], gap


def test_the_kits_own_answers_pass_every_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks' oracles and the kit's implementation agree (with the kit's names unbanned)."""
    torch_only = tuple(n for n in lab03.BAN.functions if not n.startswith("transformer_lab."))
    monkeypatch.setattr(lab03, "BAN", dataclasses.replace(lab03.BAN, functions=torch_only))
    assert run_checks(SPLIT, kit.split_heads) == dict.fromkeys(SPLIT, "")
    assert run_checks(MERGE, kit.merge_heads) == dict.fromkeys(MERGE, "")
    assert run_checks(MHA, kit.MultiHeadAttention) == dict.fromkeys(MHA, "")
    lab03.check_load_torch_weights(kit.load_torch_weights)
    hidden03.hidden_check_load_torch_weights(kit.load_torch_weights, kit.MultiHeadAttention, seed=5)


def test_the_oracle_is_refused_inside_a_check() -> None:
    class CallsTheOracle(Reference):
        def forward(self, query, key, value, mask=None):
            p = hidden03.params_of(self)
            out, w = hidden03.oracle_multi_head_attention(
                p, (query, key, value, mask), self.n_heads
            )
            return out.float(), w.float()

    with pytest.raises(AssertionError, match="which this exercise does not allow"):
        lab03.check_multi_head_attention(CallsTheOracle)
