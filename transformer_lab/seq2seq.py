"""Teacher forcing for encoder-decoders: the decoder's input and the loss over real tokens.

An encoder-decoder is trained on pairs (source, target). The decoder reads the target *shifted
right by one*, ``[BOS, y_0, ..., y_{T-2}]``, and predicts ``[y_0, ..., y_{T-1}]``: with the
causal mask, the logits at position ``t`` see ``y_0 .. y_{t-1}`` only, so every position of the
target is trained at once, in one forward pass (teacher forcing), while generation has to
produce one token at a time. The loss is the cross-entropy of the softmax over the target
vocabulary, averaged over the real target tokens: padding contributes nothing.

Shape letters: ``B`` batch, ``T`` target time, ``V`` target vocabulary.

References: Prince, *Understanding Deep Learning* (2023), sections 12.7.1 and 12.8; Vaswani et
al., "Attention Is All You Need", 2017, section 3 (the decoder's input "offset by one position").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer_lab.graded import graded

__all__ = ["sequence_loss", "shift_right"]


@graded("06_decoder_training")
def shift_right(targets: Tensor, bos_id: int) -> Tensor:
    """The decoder's input under teacher forcing: BOS, then the targets without their last token.

    Args:
        targets: ``(B, T)`` target ids.
        bos_id: the beginning-of-sequence id that starts every decoder input.

    Returns:
        ``(B, T)``, same dtype and device: ``out[:, 0] = bos_id``, ``out[:, t] = targets[:, t-1]``.
        ``targets`` is left unchanged.

    Raises:
        ValueError: if ``targets`` is not ``(B, T)``.
    """
    if targets.ndim != 2:
        raise ValueError(f"targets must be (B, T), got shape {tuple(targets.shape)}")
    bos = torch.full_like(targets[:, :1], bos_id)  # (B, 1)
    return torch.cat([bos, targets[:, :-1]], dim=1)  # (B, T)


@graded("06_decoder_training")
def sequence_loss(logits: Tensor, targets: Tensor, pad_id: int) -> Tensor:
    """Mean cross-entropy over the real (non-padding) target tokens.

    ``-log softmax(logits)[target]`` at every position whose target is not ``pad_id``, summed
    and divided by the number of such positions (a per-token mean over the whole batch, not a
    mean of per-sentence means). Computed in float32 even for half-precision logits.

    Args:
        logits: ``(B, T, V)`` decoder outputs.
        targets: ``(B, T)`` target ids, ``pad_id`` where nothing is to be predicted.
        pad_id: the padding id.

    Returns:
        A scalar tensor.

    Raises:
        ValueError: if the shapes disagree.
    """
    if logits.ndim != 3 or logits.shape[:2] != targets.shape:
        raise ValueError(
            f"logits (B, T, V) and targets (B, T) disagree: {tuple(logits.shape)} and "
            f"{tuple(targets.shape)}"
        )
    flat_logits = logits.float().flatten(0, 1)  # (B*T, V): the loss in float32
    return F.cross_entropy(flat_logits, targets.flatten(), ignore_index=pad_id)
