"""The lab 03 checks against a catalogue of typical mistakes (no nbgrader, fast).

Correct implementations in different styles pass every check; each typical wrong implementation
fails the checks it should with a message that names the mistake. The checks live in
``transformer_lab/checks/lab03.py``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest
import torch
from torch import nn

from transformer_lab import attention as kit
from transformer_lab.checks import lab03

# --------------------------------------------------------------------------------------------------
# correct implementations
# --------------------------------------------------------------------------------------------------


def split_heads(x, n_heads):
    B, T, D = x.shape
    if D % n_heads:
        raise ValueError(f"d_model={D} is not divisible by n_heads={n_heads}")
    return x.view(B, T, n_heads, D // n_heads).transpose(1, 2)  # (B, H, T, Dh)


def split_heads_einops_style(x, n_heads):
    D = x.shape[-1]
    if D % n_heads != 0:
        raise ValueError(f"cannot split width {D} into {n_heads} heads")
    return torch.stack(x.chunk(n_heads, dim=-1), dim=1)  # (B, H, T, Dh)


def merge_heads(x):
    B, H, T, Dh = x.shape
    return x.transpose(1, 2).reshape(B, T, H * Dh)  # (B, T, D)


def merge_heads_cat(x):
    return torch.cat(x.unbind(1), dim=-1)  # (B, T, H*Dh)


def _attend(q, k, v, mask, scale):
    scores = q @ k.transpose(-2, -1) * scale  # (B, H, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    w = torch.exp(scores - scores.amax(-1, keepdim=True))
    w = w / w.sum(-1, keepdim=True)
    if mask is not None:
        w = w * mask
    return w @ v, w


class MHA(nn.Module):
    """Reference style: split, the kit's lab-02 attention, merge, project."""

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

    def scale(self, dh, d):
        return 1 / math.sqrt(dh)

    def attend(self, q, k, v, mask):
        return kit.scaled_dot_product_attention(q, k, v, mask)

    def forward(self, query, key, value, mask=None):
        q = self.heads(self.q_proj(query))
        k = self.heads(self.k_proj(key))
        v = self.heads(self.v_proj(value))
        out, w = self.attend(q, k, v, mask)
        return self.out_proj(self.merge(out)), w


class MHAEinsum(MHA):
    """Einsum style with its own masked softmax."""

    def forward(self, query, key, value, mask=None):
        H = self.n_heads
        B, T, D = query.shape
        S = key.shape[1]
        q = self.q_proj(query).view(B, T, H, D // H)  # (B, T, H, Dh)
        k = self.k_proj(key).view(B, S, H, D // H)  # (B, S, H, Dh)
        v = self.v_proj(value).view(B, S, H, D // H)
        scores = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(D // H)
        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        w = torch.exp(scores - scores.amax(-1, keepdim=True))
        w = w / w.sum(-1, keepdim=True)
        if mask is not None:
            w = w * mask
        out = torch.einsum("bhts,bshd->bthd", w, v).reshape(B, T, D)
        return self.out_proj(out), w


def _projs(module):
    return (module.q_proj, module.k_proj, module.v_proj)


@torch.no_grad()
def load_torch_weights(ours, theirs):
    D = theirs.embed_dim
    for lin, w in zip(_projs(ours), theirs.in_proj_weight.split(D), strict=True):
        lin.weight.copy_(w)
    ours.out_proj.weight.copy_(theirs.out_proj.weight)
    if theirs.in_proj_bias is not None:
        for lin, b in zip(_projs(ours), theirs.in_proj_bias.chunk(3), strict=True):
            lin.bias.copy_(b)
        ours.out_proj.bias.copy_(theirs.out_proj.bias)


def load_torch_weights_state_dict(ours, theirs):
    """Through state dicts: a different route to the same copy."""
    q, k, v = theirs.in_proj_weight.detach().chunk(3)
    state = {"q_proj.weight": q, "k_proj.weight": k, "v_proj.weight": v}
    state["out_proj.weight"] = theirs.out_proj.weight.detach()
    if theirs.in_proj_bias is not None:
        bq, bk, bv = theirs.in_proj_bias.detach().chunk(3)
        state |= {"q_proj.bias": bq, "k_proj.bias": bk, "v_proj.bias": bv}
        state["out_proj.bias"] = theirs.out_proj.bias.detach()
    for name, value in state.items():
        module_name, attr = name.split(".")
        getattr(getattr(ours, module_name), attr).data.copy_(value)


# --------------------------------------------------------------------------------------------------
# typical mistakes
# --------------------------------------------------------------------------------------------------


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


def split_no_check(x, n_heads):
    B, T, D = x.shape
    return x.view(B, T, n_heads, D // n_heads).transpose(1, 2)


def split_vague_error(x, n_heads):
    if x.shape[-1] % n_heads:
        raise ValueError("n_heads must divide d_model")
    return split_heads(x, n_heads)


def split_kit(x, n_heads):
    return kit.split_heads(x, n_heads)


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


def merge_kit(x):
    return kit.merge_heads(x)


class NoOutProj(MHA):
    def forward(self, query, key, value, mask=None):
        q, k, v = (self.heads(p(t)) for p, t in ((self.q_proj, query), (self.k_proj, key),
                                                   (self.v_proj, value)))  # fmt: skip
        out, w = self.attend(q, k, v, mask)
        return self.merge(out), w


def _scaled(scale_of: Callable[[int, int], float]) -> type:
    class Scaled(MHA):
        def attend(self, q, k, v, mask):
            D = q.shape[-1] * q.shape[1]
            return _attend(q, k, v, mask, scale_of(q.shape[-1], D))

    return Scaled


ScaleDModel = _scaled(lambda dh, d: 1 / math.sqrt(d))
NoScale = _scaled(lambda dh, d: 1.0)


class SplitNoTranspose(MHA):
    def heads(self, x):
        B, T, D = x.shape
        return x.reshape(B, self.n_heads, T, D // self.n_heads)


class MergeNoTranspose(MHA):
    def merge(self, x):
        return merge_no_transpose(x)


class MaskIgnored(MHA):
    def attend(self, q, k, v, mask):
        return kit.scaled_dot_product_attention(q, k, v, None)


class MaskInverted(MHA):
    def attend(self, q, k, v, mask):
        return kit.scaled_dot_product_attention(q, k, v, None if mask is None else ~mask)


class MaskRepeatedWrongly(MHA):
    """Flattens heads into the batch as b*H + h, but repeats the mask in the order h*B + b."""

    def attend(self, q, k, v, mask):
        B, H, T, Dh = q.shape
        S = k.shape[2]
        qf, kf, vf = (t.reshape(B * H, -1, Dh) for t in (q, k, v))
        m = None
        if mask is not None:
            m = torch.broadcast_to(mask, (B, 1, T, S)) if mask.dim() < 4 or mask.shape[1] == 1 \
                else mask[:, :1]  # fmt: skip
            m = m.reshape(B, T, S).repeat(H, 1, 1)  # (H*B, T, S): wrong order
        out, w = kit.scaled_dot_product_attention(qf, kf, vf, m)
        return out.view(B, H, T, Dh), w.view(B, H, T, S)


class MaskFirstHeadOnly(MHA):
    """Assumes one mask for all heads: a (B, H, T, S) mask is cut to its first head."""

    def attend(self, q, k, v, mask):
        if mask is not None and mask.dim() == 4:
            mask = mask[:, :1]
        return kit.scaled_dot_product_attention(q, k, v, mask)


class AlwaysBias(MHA):
    def __init__(self, d_model, n_heads, bias=True):
        super().__init__(d_model, n_heads, bias=True)


class NoDivisibilityCheck(MHA):
    def __init__(self, d_model, n_heads, bias=True):
        nn.Module.__init__(self)
        self.n_heads = n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)


class PerHeadLinears(MHA):
    """Adds a projection per head on top of the shared ones: extra parameters."""

    def __init__(self, d_model, n_heads, bias=True):
        super().__init__(d_model, n_heads, bias)
        self.head_proj = nn.ModuleList(
            nn.Linear(d_model // n_heads, d_model // n_heads) for _ in range(n_heads)
        )


class AveragedWeights(MHA):
    def forward(self, query, key, value, mask=None):
        out, w = super().forward(query, key, value, mask)
        return out, w.mean(1)


class WrapsTorch(MHA):
    def __init__(self, d_model, n_heads, bias=True):
        super().__init__(d_model, n_heads, bias)
        self.inner = nn.MultiheadAttention(d_model, n_heads, bias=bias, batch_first=True)

    def forward(self, query, key, value, mask=None):
        return self.inner(query, key, value, attn_mask=None if mask is None else ~mask)


class WrapsKit(MHA):
    def forward(self, query, key, value, mask=None):
        return kit.MultiHeadAttention.forward(self, query, key, value, mask)


@torch.no_grad()
def load_wrong_order(ours, theirs):
    D = theirs.embed_dim
    k, q, v = theirs.in_proj_weight.split(D)
    for lin, w in zip(_projs(ours), (q, k, v), strict=True):
        lin.weight.copy_(w)
    ours.out_proj.weight.copy_(theirs.out_proj.weight)
    if theirs.in_proj_bias is not None:
        for lin, b in zip(_projs(ours), theirs.in_proj_bias.chunk(3), strict=True):
            lin.bias.copy_(b)
        ours.out_proj.bias.copy_(theirs.out_proj.bias)


@torch.no_grad()
def load_transposed(ours, theirs):
    D = theirs.embed_dim
    for lin, w in zip(_projs(ours), theirs.in_proj_weight.split(D), strict=True):
        lin.weight.copy_(w.T)
    ours.out_proj.weight.copy_(theirs.out_proj.weight.T)
    if theirs.in_proj_bias is not None:
        for lin, b in zip(_projs(ours), theirs.in_proj_bias.chunk(3), strict=True):
            lin.bias.copy_(b)
        ours.out_proj.bias.copy_(theirs.out_proj.bias)


@torch.no_grad()
def load_no_bias(ours, theirs):
    D = theirs.embed_dim
    for lin, w in zip(_projs(ours), theirs.in_proj_weight.split(D), strict=True):
        lin.weight.copy_(w)
    ours.out_proj.weight.copy_(theirs.out_proj.weight)
    if ours.out_proj.bias is not None:
        ours.out_proj.bias.copy_(theirs.out_proj.bias)


@torch.no_grad()
def load_no_out_proj(ours, theirs):
    D = theirs.embed_dim
    for lin, w in zip(_projs(ours), theirs.in_proj_weight.split(D), strict=True):
        lin.weight.copy_(w)
    if theirs.in_proj_bias is not None:
        for lin, b in zip(_projs(ours), theirs.in_proj_bias.chunk(3), strict=True):
            lin.bias.copy_(b)


@torch.no_grad()
def load_assumes_bias(ours, theirs):
    D = theirs.embed_dim
    for lin, w in zip(_projs(ours), theirs.in_proj_weight.split(D), strict=True):
        lin.weight.copy_(w)
    for lin, b in zip(_projs(ours), theirs.in_proj_bias.chunk(3), strict=True):
        lin.bias.copy_(b)
    ours.out_proj.weight.copy_(theirs.out_proj.weight)
    ours.out_proj.bias.copy_(theirs.out_proj.bias)


def load_plain_tensor(ours, theirs):
    D = theirs.embed_dim
    load_torch_weights(ours, theirs)
    del ours.q_proj.weight
    ours.q_proj.weight = theirs.in_proj_weight.detach()[:D].clone()


def load_kit(ours, theirs):
    kit.load_torch_weights(ours, theirs)


# --------------------------------------------------------------------------------------------------
# the tables
# --------------------------------------------------------------------------------------------------

SPLIT = [
    lab03.check_split_heads,
    lab03.check_split_heads_divisible,
    lambda f: lab03.hidden_check_split_heads(f, seed=21),
]
MERGE = [lab03.check_merge_heads, lambda f: lab03.hidden_check_merge_heads(f, seed=22)]
MHA_CHECKS = [
    lab03.check_multi_head_attention,
    lab03.check_multi_head_attention_divisible,
    lambda c: lab03.hidden_check_multi_head_attention(c, seed=23),
    lambda c: lab03.hidden_check_multi_head_attention_mask(c, seed=24),
]
LOAD = [
    lab03.check_load_torch_weights,
    lambda f: lab03.hidden_check_load_torch_weights(f, MHA, seed=25),
]
SP_VIS, SP_DIV, SP_HID = SPLIT
MG_VIS, MG_HID = MERGE
MH_VIS, MH_DIV, MH_HID, MH_MASK = MHA_CHECKS
LD_VIS, LD_HID = LOAD


@pytest.mark.parametrize(
    ("fn", "checks"),
    [
        (split_heads, SPLIT),
        (split_heads_einops_style, SPLIT),
        (merge_heads, MERGE),
        (merge_heads_cat, MERGE),
        (MHA, MHA_CHECKS),
        (MHAEinsum, MHA_CHECKS),
        (load_torch_weights, LOAD),
        (load_torch_weights_state_dict, LOAD),
    ],
    ids=lambda v: getattr(v, "__name__", "checks"),
)
def test_correct_implementations_pass(fn: Callable, checks: list[Callable]) -> None:
    for check in checks:
        check(fn)


def test_load_check_uses_the_students_module() -> None:
    lab03.hidden_check_load_torch_weights(load_torch_weights, MHAEinsum, seed=3)
    with pytest.raises(AssertionError, match="output projection"):
        lab03.hidden_check_load_torch_weights(load_torch_weights, NoOutProj, seed=3)


MISTAKES = [
    # split_heads
    (split_no_transpose, [SP_VIS, SP_HID], "then transpose(1, 2)"),
    (split_interleaved, [SP_VIS, SP_HID], "interleaved"),
    (split_no_check, [SP_DIV], "not about the real problem"),
    (split_vague_error, [SP_DIV], "does not name"),
    (split_kit, [SP_VIS, SP_DIV, SP_HID], "does not allow"),
    # merge_heads
    (merge_no_transpose, [MG_VIS, MG_HID], "without the transpose"),
    (merge_view, [MG_VIS, MG_HID], "no longer contiguous"),
    (merge_interleaved, [MG_VIS, MG_HID], "interleaved"),
    (merge_not_flat, [MG_VIS, MG_HID], "shape"),
    (merge_kit, [MG_VIS, MG_HID], "transformer_lab.attention.merge_heads"),
    # MultiHeadAttention
    (NoOutProj, [MH_VIS, MH_HID, MH_MASK], "without the output projection"),
    (ScaleDModel, [MH_VIS, MH_HID, MH_MASK], "sqrt(d_model)"),
    (NoScale, [MH_VIS, MH_HID, MH_MASK], "without scaling"),
    (SplitNoTranspose, [MH_VIS, MH_HID, MH_MASK], "no transpose"),
    (MergeNoTranspose, [MH_VIS, MH_HID, MH_MASK], "no transpose"),
    (MaskIgnored, [MH_VIS, MH_MASK], "without the mask"),
    (MaskInverted, [MH_VIS, MH_MASK], "mask inverted"),
    (MaskRepeatedWrongly, [MH_MASK], "line up with the batch axis"),
    (MaskFirstHeadOnly, [MH_MASK], "follows the mask of head 0"),
    (AlwaysBias, [MH_VIS], "bias=False"),
    (NoDivisibilityCheck, [MH_DIV], "instead of raising ValueError"),
    (PerHeadLinears, [MH_VIS], "parameters"),
    (AveragedWeights, [MH_VIS, MH_HID, MH_MASK], "(B, H, T_q, T_k)"),
    (WrapsTorch, [MH_HID, MH_MASK], "torch.nn.MultiheadAttention"),
    (WrapsKit, [MH_VIS, MH_HID, MH_MASK], "does not allow"),
    # load_torch_weights
    (load_wrong_order, [LD_VIS, LD_HID], "order query, key, value"),
    (load_transposed, [LD_VIS, LD_HID], "without .T"),
    (load_no_bias, [LD_VIS, LD_HID], "copy the biases"),
    (load_no_out_proj, [LD_VIS, LD_HID], "out_proj.weight"),
    (load_assumes_bias, [LD_HID], "NoneType"),
    (load_plain_tensor, [LD_VIS, LD_HID], "nn.Parameter"),
    (load_kit, [LD_VIS, LD_HID], "transformer_lab.attention.load_torch_weights"),
]


def _id(case: tuple) -> str:
    return f"{case[0].__name__}-{case[2][:20]}"


@pytest.mark.parametrize("case", MISTAKES, ids=[_id(c) for c in MISTAKES])
def test_mistake_fails_with_a_message_that_names_it(case: tuple) -> None:
    fn, failing, words = case
    for check in failing:
        with pytest.raises(AssertionError) as info:
            check(fn)
        assert words.lower() in str(info.value).lower(), str(info.value)


@pytest.mark.parametrize(
    "case",
    [
        c
        for c in MISTAKES
        if c[0] in (MaskIgnored, MaskInverted, MaskRepeatedWrongly, MaskFirstHeadOnly)
    ],
    ids=lambda c: c[0].__name__,
)
def test_mask_mistakes_keep_the_unmasked_points(case: tuple) -> None:
    lab03.hidden_check_multi_head_attention(case[0], seed=23)
    lab03.check_multi_head_attention_divisible(case[0])


def test_copy_to_torch_agrees_with_the_kit() -> None:
    ours = kit.MultiHeadAttention(8, 2).eval()
    theirs = lab03.copy_to_torch(ours, 2)
    x = torch.randn(2, 5, 8)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    ref, ref_w = theirs(x, x, x, attn_mask=~mask, average_attn_weights=False)
    out, w = ours(x, x, x, mask=mask)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(w, ref_w, atol=1e-5, rtol=1e-4)


def test_the_kits_own_heads_pass_every_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks' oracles and the kit's implementation agree (with the kit's names unbanned)."""
    kit_names = lab03._BAN.functions
    torch_only = tuple(n for n in kit_names if not n.startswith("transformer_lab."))
    monkeypatch.setattr(lab03, "_BAN", dataclasses.replace(lab03._BAN, functions=torch_only))
    for check in SPLIT:
        check(kit.split_heads)
    for check in MERGE:
        check(kit.merge_heads)
    for check in MHA_CHECKS:
        check(kit.MultiHeadAttention)
    lab03.check_load_torch_weights(kit.load_torch_weights)
    lab03.hidden_check_load_torch_weights(kit.load_torch_weights, kit.MultiHeadAttention, seed=5)
