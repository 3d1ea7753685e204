"""Visible checks of lab 05 (masked attention): the masks, masked attention and a leak detector.

The three masks are ordinary parts (:mod:`transformer_lab.checks._generated`: :data:`CAUSAL`,
:data:`PADDING`, :data:`COMBINE`); masked attention is judged by the shared attention judge
(:mod:`transformer_lab.checks._attention`) on worked examples whose masked keys have the
LARGEST raw scores, with a row that sees nothing, in float32 and float16. Expected values and
the typical mistakes' outputs are stored in ``fixtures/lab05.json``: no oracle lives here. The
leak detector is tried on maps whose causality is known by construction. The kit's masks,
PyTorch's mask builder and every attention kernel are refused while the student's code runs.

Reference: Prince, *Understanding Deep Learning* (2023), section 12.7.2; Vaswani et al.,
"Attention Is All You Need", NeurIPS 2017, section 3.2.3; ``docs/contracts.md`` (boolean masks,
True = may attend, broadcasting to ``(B, H, T, S)``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer_lab.checks import _attention, spec
from transformer_lab.checks._common import Case, call_forbidding, generator
from transformer_lab.checks._generated import Given, Ordinary

__all__ = [
    "check_causal_mask",
    "check_combine_masks",
    "check_depends_on_future",
    "check_masked_attention",
    "check_masked_attention_half",
    "check_padding_mask",
]

#: The lab's spec (``specs/lab05.toml``): its bans and shared tolerances.
SPEC = spec.load("05_masking")
MASK_BAN = SPEC.ban("masks")
ATTENTION_BAN = SPEC.ban("attention")
DETECTOR_BAN = SPEC.ban("detector")


def show_lengths(lengths: Sequence[int] | Tensor) -> str:
    """How ``lengths`` appears in messages: ``[3, 1]`` or ``torch.tensor([3, 1])``."""
    return f"torch.tensor({lengths.tolist()})" if isinstance(lengths, Tensor) else str(lengths)


def _screen_mask(case: Case[Given]) -> None:
    """A mask that is no tensor of booleans fails at once, naming its dtype."""
    if case.got.dtype != torch.bool:
        raise AssertionError(f"{case.what} has dtype {case.got.dtype}, expected torch.bool.")


def _describe_mask(case: Case[Given]) -> str:
    """Where a wrong mask differs: its shape, or how many entries and the first of them."""
    got, want = case.got, case.want
    if got.shape != want.shape:
        return f"{case.what} has shape {tuple(got.shape)}, expected {tuple(want.shape)}."
    wrong_at = got != want
    idx = tuple(int(i) for i in wrong_at.nonzero()[0])
    return (
        f"{case.what} is wrong at {int(wrong_at.sum())} of {want.numel()} entries; at index "
        f"{idx} you have {bool(got[idx])}, expected {bool(want[idx])}."
    )


def _same_mask(got: Tensor, want: Tensor) -> bool:
    return got.dtype == want.dtype and got.shape == want.shape and bool(torch.equal(got, want))


def _mask_part(
    what: Callable[..., str], rule: str, on_error: Callable[..., str] | None = None, **kwargs: Any
) -> Ordinary:
    """The :class:`Ordinary` of a mask function: the answer runs under :data:`MASK_BAN` (an
    exception's message ends with ``on_error(*args)``) and must return a tensor (a mask)."""

    def run(fn: Callable[..., Any], *args: Any) -> Tensor:
        shown = what(*args)
        got = call_forbidding(
            fn, args, {}, ban=MASK_BAN, what=shown, on_error=on_error(*args) if on_error else ""
        )
        if not isinstance(got, Tensor):
            missing = " (did you forget to `return`?)" if got is None else ""
            raise AssertionError(
                f"{shown} returned {got!r:.80}{missing}; return a torch.bool tensor."
            )
        return got.detach().to("cpu")

    return Ordinary(
        "lab05",
        call=run,
        what=what,
        describe=_describe_mask,
        rule=rule,
        same=_same_mask,
        screen=_screen_mask,
        output=lambda mask: torch.as_tensor(mask, dtype=torch.bool),
        **kwargs,
    )


#: ``causal_mask(T)``: a case is ``(T,)``.
CAUSAL = _mask_part(
    lambda T: f"causal_mask({T})",
    "Query t (row) may attend key s (column) when s <= t: a (T, T) lower triangle.",
)

#: ``padding_mask(lengths, max_len)``: a case is ``(lengths, max_len)``, lengths a list or a
#: tensor (stored with a flag saying which).
PADDING = _mask_part(
    lambda lengths, max_len: f"padding_mask({show_lengths(lengths)}, {max_len})",
    "Entry (b, p) of the (B, max_len) mask is True when position p < lengths[b].",
    lambda lengths, max_len: (
        ""
        if isinstance(lengths, Tensor)
        else "lengths may be a Python list or a tensor: torch.as_tensor(lengths) turns either "
        "into a tensor."
    ),
    load=lambda lengths, max_len, tensor: (torch.tensor(lengths) if tensor else lengths, max_len),
)


def _combine_what(padding: Tensor, causal: Tensor) -> str:
    T = causal.shape[0]
    lengths = [int(n) for n in padding.sum(1)]
    lower = torch.equal(causal, torch.ones(T, T, dtype=torch.bool).tril())
    return (
        f"combine_masks(padding, causal) with padding = padding_mask({lengths}, {T}) and causal = "
        + (f"causal_mask({T})" if lower else f"the ({T}, {T}) mask {causal.int().tolist()}")
    )


#: ``combine_masks(padding, causal)``: a case is ``(padding, causal)``, boolean tensors.
COMBINE = _mask_part(
    _combine_what,
    "The (B, 1, T, T) result is True at (b, 0, t, s) when padding[b, s] and causal[t, s] are.",
    load=lambda padding, causal: (torch.tensor(padding), torch.tensor(causal)),
)


class Probe(NamedTuple):
    """A differentiable map ``(B, T, ...) -> (B, T, ...)`` with known causality (``leaks``: an
    output at ``<= t`` reads an input after ``t``), and what a detector wrong on it is told."""

    name: str
    fn: Callable[[Tensor], Tensor]
    leaks: bool
    hint: str = ""


def judge_detector(fn: Callable[..., Any], probes: Sequence[Probe], x: Tensor) -> None:
    """Run the student's detector on every probe (under its ban; ``x`` must stay unchanged and
    the answer be a truth value); the first wrong verdict fails with the probe's hint."""
    in_place = (
        "changed x in place: the caller's input must be left as it was. Perturb a copy "
        "(x.clone()) of the input."
    )
    for probe in probes:
        what = f"depends_on_future({probe.name}, x) with x of shape {tuple(x.shape)}"
        got = call_forbidding(fn, (probe.fn, x), {}, ban=DETECTOR_BAN, what=what, in_place=in_place)
        numpy_bool = type(got).__module__ == "numpy" and type(got).__name__ in ("bool", "bool_")
        if numpy_bool or (isinstance(got, Tensor) and got.numel() == 1 and got.dtype == torch.bool):
            got = bool(got)  # a one-element bool tensor, or numpy's bool from (a != b).any()
        elif not isinstance(got, bool):
            shown = "None (did you forget to `return`?)" if got is None else type(got).__name__
            raise AssertionError(f"{what} should return True or False, got {shown}.")
        if got != probe.leaks:
            verdict = "depends on the future" if probe.leaks else "looks only at the past"
            hint = probe.hint or (TIME_AXIS if probe.leaks else LOOKS_BACK)
            raise AssertionError(f"{what} returned {got}, but {probe.name} {verdict}. {hint}")


#: What a detector that misjudges a probe is told, by kind of probe (the hidden checks' too).
LOOKS_BACK = (
    "This map looks only at the past, so out[:, :t+1] cannot change when only x[:, t+1:] "
    "changes. Compare only out[:, :t+1] (the outputs after t may change, that is allowed), "
    "change only the positions after t (never t itself), and perturb the future while watching "
    "the past, not the other way round."
)
READS_AHEAD = (
    "Only some outputs near the start read ahead here. Try every cut t = 0 .. T-2 and change "
    "all the future positions x[:, t+1:] each time: changing only the last position, or one "
    "cut, misses leaks that reach only a little way ahead."
)
TIME_AXIS = (
    "Time is dim 1 of x (B, T, ...): change x[:, t+1:] for every cut t, and compare "
    "out[:, :t+1] with a tight tolerance (torch.equal, or torch.allclose's defaults)."
)


def visible_probes() -> list[Probe]:
    """The maps the visible check tries the detector on (causal ones first)."""
    return [
        Probe("(lambda x: 2 * x)", lambda x: 2.0 * x, False),
        Probe("(lambda x: x.cumsum(dim=1))", lambda x: x.cumsum(dim=1), False),
        Probe(
            "causal self-attention",
            lambda x: F.scaled_dot_product_attention(x, x, 2.0 * x, is_causal=True),
            False,
        ),
        Probe("(lambda x: x.flip(1))", lambda x: x.flip(1), True),
        Probe(
            "self-attention without a mask",
            lambda x: F.scaled_dot_product_attention(x, x, 2.0 * x),
            True,
        ),
        Probe(
            "a map where output 0 also reads input 1",
            lambda x: torch.cat([x[:, :1] + x[:, 1:2], x[:, 1:]], dim=1),
            True,
            READS_AHEAD,
        ),
        Probe(
            "(lambda x: x - x.mean(dim=1, keepdim=True))",
            lambda x: x - x.mean(dim=1, keepdim=True),
            True,
        ),
    ]


def expect_attention(
    fn: Callable[..., Any],
    inputs: tuple[Tensor, Tensor, Tensor, Tensor],
    described: str,
    want: tuple[Tensor, Tensor],
    mistakes: Mapping[str, tuple[Tensor, Tensor]],
    *,
    tol: float,
) -> None:
    """``masked_attention(q, k, v, mask)`` must return ``want = (out, weights)``."""
    q, k, v, mask = inputs
    kind = "" if q.dtype == torch.float32 else f" in {str(q.dtype).replace('torch.', '')}"
    what = (
        f"masked_attention(q, k, v, mask){kind} with q {tuple(q.shape)}, k {tuple(k.shape)}, "
        f"v {tuple(v.shape)} and {described}"
    )
    result = _attention.call_attention(fn, q, k, v, mask, what, ban=ATTENTION_BAN)
    probe = _attention.overflow_probe(
        fn, q, v, masked=True, ban=ATTENTION_BAN, name="masked_attention"
    )
    _attention.judge_attention(result, want, mistakes, what, q, k, v, mask, tol=tol, probe=probe)


def attention_example(name: str) -> tuple[Tensor, Tensor, Tensor, Tensor, str]:
    """``(q, k, v, mask, description)`` of the worked example ``"causal"`` (else ``"padded"``)
    (float32): multiples of 1/8 below 4 (exact in float16), the keys' scores growing with their
    position, so that the keys a mask hides (the future, the padding) score highest."""
    if name == "causal":
        b, t, d = torch.meshgrid(torch.arange(2), torch.arange(5), torch.arange(4), indexing="ij")
        q = 0.5 + 0.25 * ((t + 2 * d + b) % 3)
        k = 0.5 * (t - 2) + 0.125 * ((t + d + 2 * b) % 3 - 1)
        b, s, e = torch.meshgrid(torch.arange(2), torch.arange(5), torch.arange(3), indexing="ij")
        v = 0.5 * ((3 * s + e + b) % 5 - 2)
        mask = torch.ones(5, 5, dtype=torch.bool).tril()  # (T, S)
        return q.float(), k.float(), v.float(), mask, "the causal (5, 5) mask"
    b, h, t, d = torch.meshgrid(*(torch.arange(n) for n in (2, 2, 3, 2)), indexing="ij")
    q = 0.5 + 0.25 * ((b + h + t + d) % 4)
    b, h, s, d = torch.meshgrid(*(torch.arange(n) for n in (2, 2, 5, 2)), indexing="ij")
    k = 0.5 * (s - 1) + 0.25 * ((h + d) % 2)
    b, h, s, e = torch.meshgrid(*(torch.arange(n) for n in (2, 2, 5, 4)), indexing="ij")
    v = 0.5 * ((s + 2 * e + h) % 5) - 1.0
    mask = torch.tensor(
        [
            [[1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0]],
            [[1, 1, 1, 1, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]],
        ],
        dtype=torch.bool,
    )[:, None]  # (B, 1, T, S)
    return q.float(), k.float(), v.float(), mask, "a (2, 1, 3, 5) mask with an empty row"


check_causal_mask = CAUSAL.visible(
    "check_causal_mask",
    """Worked examples ``causal_mask(4)``, ``causal_mask(1)``, ``causal_mask(7)``.""",
)
check_padding_mask = PADDING.visible(
    "check_padding_mask",
    """Worked examples: lengths ``[3, 1, 5, 0]`` and ``max_len=6``, as a tensor and a list, and
    lengths ``[2, 0]`` with ``max_len=3`` (a mask that ignores its arguments does not pass).""",
)
check_combine_masks = COMBINE.visible(
    "check_combine_masks",
    """Worked examples: two batches of sequences of unequal length, with the causal mask.""",
)


def _check_attention(fn: Callable[..., Any], dtype: torch.dtype) -> None:
    tol = SPEC.tol("float32" if dtype == torch.float32 else "half")  # the spec's tolerances
    for name in ("causal", "padded"):
        q, k, v, mask, described = attention_example(name)
        want, mistakes = _attention.stored_pair("lab05", f"masked_attention example {name!r}")
        inputs = (q.to(dtype), k.to(dtype), v.to(dtype), mask)
        expect_attention(fn, inputs, described, want, mistakes, tol=tol)


def check_masked_attention(fn: Callable[..., Any]) -> None:
    """Worked examples in float32: a causal mask, and padding with a row that sees nothing."""
    _check_attention(fn, torch.float32)


def check_masked_attention_half(fn: Callable[..., Any]) -> None:
    """The same worked examples in float16: no overflow, no NaN, the same weights."""
    _check_attention(fn, torch.float16)


def check_depends_on_future(fn: Callable[..., Any]) -> None:
    """Causal maps must give False, leaky ones True; ``x`` must be left unchanged."""
    x = torch.randn(2, 6, 3, generator=generator(505))
    judge_detector(fn, visible_probes(), x)
