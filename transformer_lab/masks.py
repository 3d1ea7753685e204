"""Boolean attention masks: causal, padding, their combination, validation and a causality probe.

Masks are plain boolean tensors, built here and consumed by :mod:`transformer_lab.attention`
(which imports this module, never the other way round); lab 05's ``masked_attention`` lives there.

Convention (as in ``torch.nn.functional.scaled_dot_product_attention``): masks are boolean and
**True means "may attend"** (or "is a real token" for a padding mask). Attention masks broadcast to
the score shape ``(B, H, T, S)``. A query row with no allowed key gets zero weights (never NaN);
:func:`transformer_lab.attention.scaled_dot_product_attention` implements that rule.

Shape letters: ``B`` batch, ``H`` heads, ``T`` query time, ``S`` key time, ``Dh`` head width.

Reference: Vaswani et al., "Attention Is All You Need", 2017, section 3.2.3 (masking the decoder's
self-attention so that position ``t`` cannot see ``t+1..``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from transformer_lab.graded import graded

__all__ = [
    "causal_mask",
    "check_mask",
    "combine_masks",
    "depends_on_future",
    "key_padding_to_attention",
    "padding_mask",
]


@graded("05_masking")
def causal_mask(T: int, device: torch.device | str | None = None) -> Tensor:
    """Lower-triangular mask: query ``t`` may attend keys ``0..t``.

    Args:
        T: sequence length.
        device: device of the result.

    Returns:
        Bool tensor ``(T, T)``, ``True`` on and below the diagonal.
    """
    if T < 0:
        raise ValueError(f"T={T} must be >= 0")
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()


@graded("05_masking")
def padding_mask(lengths: Tensor | Sequence[int], max_len: int) -> Tensor:
    """Mask of real tokens for right-padded sequences.

    Args:
        lengths: number of real tokens per sequence, ``(B,)``.
        max_len: padded length ``T``.

    Returns:
        Bool tensor ``(B, max_len)``, ``True`` at positions ``< lengths[b]``.

    Raises:
        ValueError: if a length is negative or larger than ``max_len``.
    """
    lengths = torch.as_tensor(lengths)
    if lengths.ndim != 1:
        raise ValueError(f"lengths must be 1-D (B,), got shape {tuple(lengths.shape)}")
    if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > max_len):
        raise ValueError(f"lengths={lengths.tolist()} must lie in [0, max_len={max_len}]")
    positions = torch.arange(max_len, device=lengths.device)  # (T,)
    return positions[None, :] < lengths[:, None]  # (B, T)


def key_padding_to_attention(padding: Tensor) -> Tensor:
    """Turn a ``(B, S)`` real-token mask into an attention mask over keys, ``(B, 1, 1, S)``."""
    if padding.ndim != 2:
        raise ValueError(f"padding mask must be (B, S), got shape {tuple(padding.shape)}")
    return padding[:, None, None, :]  # (B, 1, 1, S)


@graded("05_masking")
def combine_masks(padding: Tensor | None, causal: Tensor | None) -> Tensor:
    """Combine a padding mask over keys with a causal mask.

    Padding removes keys only: a query at a padded position still attends to the real tokens
    before it, so no row becomes fully masked and the loss simply ignores that position.

    Args:
        padding: ``(B, T)`` bool, True at real tokens (or None).
        causal: ``(T, T)`` bool, True where query may attend key (or None).

    Returns:
        Bool tensor ``(B, 1, T, T)`` (``(1, 1, T, T)`` if ``padding`` is None).

    Raises:
        ValueError: if both are None, a mask is not boolean, or the lengths disagree.
    """
    if padding is None and causal is None:
        raise ValueError("combine_masks needs at least one of padding and causal")
    for name, m in (("padding", padding), ("causal", causal)):
        if m is not None and m.dtype != torch.bool:
            raise ValueError(f"{name} mask must be boolean, got dtype {m.dtype}")
    if causal is None:
        assert padding is not None
        T = padding.shape[-1]
        causal = torch.ones(T, T, dtype=torch.bool, device=padding.device)
    if padding is None:
        return causal[None, None]  # (1, 1, T, T)
    if padding.ndim != 2 or causal.ndim != 2 or padding.shape[1] != causal.shape[1]:
        raise ValueError(
            f"padding mask of shape {tuple(padding.shape)} (B, T) and causal mask of shape "
            f"{tuple(causal.shape)} (T, T) do not agree"
        )
    return padding[:, None, None, :] & causal[None, None, :, :]  # (B, 1, T, T)


def check_mask(mask: Tensor, scores_shape: Sequence[int]) -> Tensor:
    """Validate an attention mask against the shape of the scores it will mask.

    Args:
        mask: bool tensor, True = may attend.
        scores_shape: shape of the scores, e.g. ``(B, H, T, S)`` (any leading dims).

    Returns:
        The mask, unchanged.

    Raises:
        ValueError: if the mask is not boolean, or does not broadcast to ``scores_shape``.
    """
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(
            f"attention mask must be a boolean tensor (True = may attend), got {got}; "
            "convert with mask.bool() or build it with causal_mask/padding_mask"
        )
    target = tuple(scores_shape)
    # Broadcasting aligns trailing dims; each mask dim must be 1 or the scores' own size, so
    # the mask can neither mismatch nor enlarge the scores.
    fits = mask.ndim <= len(target) and all(
        m == 1 or m == t for m, t in zip(reversed(mask.shape), reversed(target), strict=False)
    )
    if not fits:
        raise ValueError(
            f"attention mask of shape {tuple(mask.shape)} does not broadcast to the attention "
            f"scores of shape {target} (B, H, T, S)"
        )
    return mask


@graded("05_masking")
def depends_on_future(
    fn: Callable[[Tensor], Tensor],
    x: Tensor,
    *,
    vocab_size: int | None = None,
    trials: int = 2,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    generator: torch.Generator | None = None,
) -> bool:
    """Probe whether a sequence map lets position ``t`` see positions after ``t``.

    For each cut ``t``, the inputs at positions ``> t`` are replaced with different values and
    the outputs at positions ``<= t`` are compared. A causal ``fn`` gives identical outputs there.

    Args:
        fn: maps ``x`` of shape ``(B, T, ...)`` to outputs of shape ``(B, T, ...)``.
        x: float features ``(B, T, D)`` or integer tokens ``(B, T)``.
        vocab_size: for integer ``x``, the range of replacement tokens (default ``x.max() + 1``,
            at least 2).
        trials: random perturbations per cut.
        rtol: relative tolerance of the comparison.
        atol: absolute tolerance of the comparison.
        generator: random source (a fresh one seeded with 0 by default).

    Returns:
        True if some output at a position ``<= t`` changed when only positions ``> t`` changed.
    """
    if x.ndim < 2:
        raise ValueError(f"x must be batched (B, T, ...), got shape {tuple(x.shape)}")
    if generator is None:
        generator = torch.Generator(device="cpu").manual_seed(0)
    T = x.shape[1]
    integer = not torch.is_floating_point(x)
    if integer:
        vocab = vocab_size if vocab_size is not None else max(int(x.max()) + 1, 2)
    with torch.no_grad():
        base = fn(x)
        for t in range(T - 1):
            for _ in range(trials):
                future = x[:, t + 1 :]
                if integer:
                    shift = torch.randint(1, vocab, future.shape, generator=generator)
                    new_future = (future + shift.to(x.device)) % vocab
                else:
                    noise = torch.randn(future.shape, generator=generator, dtype=x.dtype)
                    new_future = future + 1.0 + noise.to(x.device)
                x2 = torch.cat([x[:, : t + 1], new_future], dim=1)
                out = fn(x2)
                if not torch.allclose(out[:, : t + 1], base[:, : t + 1], rtol=rtol, atol=atol):
                    return True
    return False
