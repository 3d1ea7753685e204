"""Lab 06 checks against a catalogue of typical mistakes and of correct variants (no nbgrader).

Each wrong implementation must fail the checks that should catch it, with a message naming the
mistake; each correct variant (explicit or fused attention, nn.LayerNorm or the kit's LayerNorm,
dropout modules or F.dropout, loops or vectorised code, other schedules) must pass every check,
visible and hidden. Calling the kit's (or PyTorch's) version earns nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from check_support import assert_fails, run_checks
from lightning.pytorch.loggers import CSVLogger
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy, MulticlassExactMatch

import transformer_lab.blocks as kit_blocks
import transformer_lab.generation as kit_generation
import transformer_lab.seq2seq as kit_seq2seq
from transformer_lab.attention import MultiHeadAttention
from transformer_lab.blocks import FeedForward, LayerNorm
from transformer_lab.checks import lab06
from transformer_lab.checks._common import load_weights
from transformer_lab.grading.hidden import lab06 as hidden06
from transformer_lab.lab import Session
from transformer_lab.training.trainers import BARE

# ======================================================================================
# DecoderBlock
# ======================================================================================

BLOCK_CHECKS = {
    "visible": lab06.check_decoder_block,
    "hidden": lambda c: hidden06.hidden_check_decoder_block(c, seed=601),
    "masks": lambda c: hidden06.hidden_check_decoder_block_masks(c, seed=602),
    "training": lambda c: hidden06.hidden_check_decoder_block_training(c, seed=603),
}


class Block(nn.Module):
    """The notebook's answer: kit attention (explicit path), nn.LayerNorm, dropout modules."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout)
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)
        self.p = dropout

    def sa(self, x: Tensor, mask: Tensor | None) -> Tensor:
        return self.self_attn(x, x, x, mask=mask)[0]

    def ca(self, x: Tensor, memory: Tensor, mask: Tensor | None) -> Tensor:
        return self.cross_attn(x, memory, memory, mask=mask)[0]

    def forward(self, x, memory, self_mask=None, memory_mask=None):
        x = self.norm1(x + self.dropout1(self.sa(x, self_mask)))
        x = self.norm2(x + self.dropout2(self.ca(x, memory, memory_mask)))
        return self.norm3(x + self.dropout3(self.ff(x)))


class BlockFused(nn.Module):
    """Fused attention (need_weights=False), the kit's LayerNorm, F.dropout, a written-out FF."""

    def __init__(self, d_model, n_heads, d_ff, dropout=0.0):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout)
        self.ff = nn.Module()
        self.ff.linear1 = nn.Linear(d_model, d_ff)
        self.ff.linear2 = nn.Linear(d_ff, d_model)
        self.norm1, self.norm2, self.norm3 = (LayerNorm(d_model) for _ in range(3))
        self.p = dropout

    def _drop(self, h):
        return F.dropout(h, self.p, training=self.training)

    def forward(self, x, memory, self_mask=None, memory_mask=None):
        a, _ = self.self_attn(x, x, x, self_mask, need_weights=False)
        x = self.norm1(x + self._drop(a))
        c, _ = self.cross_attn(x, memory, memory, mask=memory_mask, need_weights=False)
        x = self.norm2(x + self._drop(c))
        h = self.ff.linear2(self._drop(torch.relu(self.ff.linear1(x))))
        return self.norm3(x + self._drop(h))


class BlockMemoryAsQuery(Block):
    def ca(self, x, memory, mask):
        return self.cross_attn(memory, x, x)[0]


class BlockKeysFromX(Block):
    def ca(self, x, memory, mask):
        return self.cross_attn(x, x, memory, mask=mask)[0]


class BlockPreNorm(Block):
    def forward(self, x, memory, self_mask=None, memory_mask=None):
        x = x + self.dropout1(self.sa(self.norm1(x), self_mask))
        x = x + self.dropout2(self.ca(self.norm2(x), memory, memory_mask))
        return x + self.dropout3(self.ff(self.norm3(x)))


class BlockNoCrossResidual(Block):
    def forward(self, x, memory, self_mask=None, memory_mask=None):
        x = self.norm1(x + self.dropout1(self.sa(x, self_mask)))
        x = self.norm2(self.dropout2(self.ca(x, memory, memory_mask)))
        return self.norm3(x + self.dropout3(self.ff(x)))


class BlockSelfMaskIgnored(Block):
    def sa(self, x, mask):
        return self.self_attn(x, x, x)[0]


class BlockMemoryMaskIgnored(Block):
    def ca(self, x, memory, mask):
        return self.cross_attn(x, memory, memory)[0]


class BlockMasksSwapped(Block):
    def forward(self, x, memory, self_mask=None, memory_mask=None):
        return super().forward(x, memory, memory_mask, self_mask)


class BlockCrossFirst(Block):
    def forward(self, x, memory, self_mask=None, memory_mask=None):
        x = self.norm1(x + self.dropout1(self.ca(x, memory, memory_mask)))
        x = self.norm2(x + self.dropout2(self.sa(x, self_mask)))
        return self.norm3(x + self.dropout3(self.ff(x)))


class BlockNormsSwapped(Block):
    def forward(self, x, memory, self_mask=None, memory_mask=None):
        x = self.norm1(x + self.dropout1(self.sa(x, self_mask)))
        x = self.norm3(x + self.dropout2(self.ca(x, memory, memory_mask)))
        return self.norm2(x + self.dropout3(self.ff(x)))


class BlockNoCross(Block):
    def forward(self, x, memory, self_mask=None, memory_mask=None):
        x = self.norm1(x + self.dropout1(self.sa(x, self_mask)))
        return self.norm3(x + self.dropout3(self.ff(x)))


class BlockDropoutAfterNorm(Block):
    def forward(self, x, memory, self_mask=None, memory_mask=None):
        x = self.dropout1(self.norm1(x + self.sa(x, self_mask)))
        x = self.dropout2(self.norm2(x + self.ca(x, memory, memory_mask)))
        return self.dropout3(self.norm3(x + self.ff(x)))


class BlockNoResidualDropout(Block):
    def forward(self, x, memory, self_mask=None, memory_mask=None):
        x = self.norm1(x + self.sa(x, self_mask))
        x = self.norm2(x + self.ca(x, memory, memory_mask))
        return self.norm3(x + self.ff(x))


class BlockDropoutInEval(Block):
    def forward(self, x, memory, self_mask=None, memory_mask=None):
        x = self.norm1(x + F.dropout(self.sa(x, self_mask), self.p))
        x = self.norm2(x + F.dropout(self.ca(x, memory, memory_mask), self.p))
        return self.norm3(x + F.dropout(self.ff(x), self.p))


class BlockDropoutIgnored(Block):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.0):
        super().__init__(d_model, n_heads, d_ff, 0.0)


class BlockCallsKit(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.0):
        super().__init__()
        self.inner = kit_blocks.DecoderBlock(d_model, n_heads, d_ff, dropout)
        for name in ("self_attn", "cross_attn", "ff", "norm1", "norm2", "norm3"):
            setattr(self, name, getattr(self.inner, name))

    def forward(self, x, memory, self_mask=None, memory_mask=None):
        return self.inner(x, memory, self_mask, memory_mask)


class BlockCallsTorch(Block):
    def forward(self, x, memory, self_mask=None, memory_mask=None):
        layer = nn.TransformerDecoderLayer(x.shape[-1], 4, 32, batch_first=True)
        return layer(x, memory)


class BlockNotImplemented(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.0):
        super().__init__()
        raise NotImplementedError()


@pytest.mark.parametrize("cls", [Block, BlockFused])
def test_correct_decoder_blocks_pass_every_check(cls) -> None:
    assert run_checks(BLOCK_CHECKS, cls) == dict.fromkeys(BLOCK_CHECKS, "")


ALL = ["visible", "hidden", "masks", "training"]


BLOCK_MISTAKES = [
    (BlockMemoryAsQuery, ALL, "the queries come from the decoder states x", ()),
    (BlockKeysFromX, ALL, "the keys and values from memory", ()),
    (BlockPreNorm, ALL, "pre-norm", ()),
    (BlockNoCrossResidual, ALL, "no residual connection", ()),
    (BlockSelfMaskIgnored, ALL, "self_mask", ()),
    (BlockMemoryMaskIgnored, ["visible", "hidden", "masks"], "memory_mask", ()),
    (BlockMasksSwapped, ALL, "self_mask", ()),
    (BlockCrossFirst, ALL, "before the self-attention", ()),
    (BlockNormsSwapped, ALL, "norm2 and norm3 are swapped", ()),
    (BlockNoCross, ALL, "cross-attention", ()),
    (BlockDropoutAfterNorm, ["training"], "not after the norm", ()),
    (BlockNoResidualDropout, ["training"], "before it is added back", ()),
    (BlockDropoutInEval, ["training"], "off in eval mode", ()),
    (BlockDropoutIgnored, ["training"], "must return norm3(norm2(norm1(x)))", ()),
]


@pytest.mark.parametrize(("cls", "failing", "words", "generic"), BLOCK_MISTAKES)
def test_decoder_block_mistakes_fail_with_a_message_naming_them(cls, failing, words, generic):
    assert_fails(BLOCK_CHECKS, cls, failing, words, generic=generic)


@pytest.mark.parametrize("cls", [BlockCallsKit, BlockCallsTorch])
def test_decoder_block_calling_the_kit_or_torch_earns_nothing(cls) -> None:
    outcomes = run_checks(BLOCK_CHECKS, cls)
    assert all("does not allow" in msg for msg in outcomes.values()), outcomes


def test_decoder_block_not_implemented_says_so() -> None:
    outcomes = run_checks(BLOCK_CHECKS, BlockNotImplemented)
    assert all("not implemented yet" in msg for msg in outcomes.values()), outcomes


class BlockReturnsFloat32(Block):
    def forward(self, x, memory, self_mask=None, memory_mask=None):
        return super().forward(x, memory, self_mask, memory_mask).float()


def test_a_block_that_leaves_bfloat16_loses_only_the_masks_check() -> None:
    """Under precision="bf16-true" a block keeps its inputs' dtype (float32 inputs pass)."""
    for check in ("visible", "hidden", "training"):
        BLOCK_CHECKS[check](BlockReturnsFloat32)
    with pytest.raises(AssertionError) as raised:
        BLOCK_CHECKS["masks"](BlockReturnsFloat32)
    assert "in torch.bfloat16 turned torch.bfloat16 inputs into torch.float32" in str(raised.value)


def test_the_oracle_agrees_with_the_kit() -> None:
    g = torch.Generator().manual_seed(0)
    weights = hidden06.random_weights(12, 24, g, "self_attn", "cross_attn")
    x, memory = torch.randn(2, 4, 12, generator=g), torch.randn(2, 6, 12, generator=g)
    kit = kit_blocks.DecoderBlock(12, 3, 24).eval()
    load_weights(kit, weights, "the kit's DecoderBlock")
    for masks in ((None, None), hidden06._masks(2, 4, 6, g)):
        got = hidden06.oracle_block(12, 3, 24, weights, x, memory, *masks).float()
        torch.testing.assert_close(kit(x, memory, *masks), got, atol=1e-5, rtol=1e-5)


# ======================================================================================
# shift_right
# ======================================================================================

SHIFT_CHECKS = {
    "visible": lab06.check_shift_right,
    "hidden": lambda fn: hidden06.hidden_check_shift_right(fn, seed=611),
}


def shift_cat(targets, bos_id):
    return torch.cat([torch.full_like(targets[:, :1], bos_id), targets[:, :-1]], dim=1)


def shift_loops(targets, bos_id):
    out = torch.empty_like(targets)
    for b in range(targets.shape[0]):
        out[b, 0] = bos_id
        for t in range(1, targets.shape[1]):
            out[b, t] = targets[b, t - 1]
    return out


def shift_roll_then_fix(targets, bos_id):
    out = torch.roll(targets, 1, dims=1)
    out[:, 0] = bos_id
    return out


def shift_pad(targets, bos_id):
    return F.pad(targets[:, :-1], (1, 0), value=bos_id)


def shift_left(targets, bos_id):
    return torch.cat([targets[:, 1:], torch.zeros_like(targets[:, :1])], dim=1)


def shift_no_bos(targets, bos_id):
    return torch.cat([torch.zeros_like(targets[:, :1]), targets[:, :-1]], dim=1)


def shift_bos_at_end(targets, bos_id):
    return torch.cat([targets[:, 1:], torch.full_like(targets[:, :1], bos_id)], dim=1)


def shift_drops_first(targets, bos_id):
    return torch.cat([torch.full_like(targets[:, :1], bos_id), targets[:, 1:]], dim=1)


def shift_roll(targets, bos_id):
    return torch.roll(targets, 1, dims=1)


def shift_keeps_last(targets, bos_id):
    return torch.cat([torch.full_like(targets[:, :1], bos_id), targets], dim=1)


def shift_bos_one(targets, bos_id):
    return shift_cat(targets, 1)


def shift_batch_axis(targets, bos_id):
    return torch.cat([torch.full_like(targets[:1], bos_id), targets[:-1]], dim=0)


def shift_in_place(targets, bos_id):
    targets[:, 1:] = targets[:, :-1].clone()
    targets[:, 0] = bos_id
    return targets


def shift_float(targets, bos_id):
    return torch.cat([torch.ones(targets.shape[0], 1) * bos_id, targets[:, :-1]], dim=1)


def shift_calls_kit(targets, bos_id):
    return kit_seq2seq.shift_right(targets, bos_id)


@pytest.mark.parametrize("fn", [shift_cat, shift_loops, shift_roll_then_fix, shift_pad])
def test_correct_shifts_pass_every_check(fn) -> None:
    assert run_checks(SHIFT_CHECKS, fn) == dict.fromkeys(SHIFT_CHECKS, "")


SHIFT_MISTAKES = [
    (shift_left, ["visible", "hidden"], "shifted LEFT"),
    (shift_no_bos, ["visible", "hidden"], "must hold bos_id"),
    (shift_bos_at_end, ["visible", "hidden"], "BOS goes FIRST"),
    (shift_drops_first, ["visible", "hidden"], "dropped the FIRST target"),
    (shift_roll, ["visible", "hidden"], "torch.roll wraps"),
    (
        shift_keeps_last,
        ["visible", "hidden"],
        {"visible": "has shape (2, 5), expected (2, 4)", "hidden": "(4, 7), expected (4, 6)"},
    ),
    (shift_bos_one, ["visible", "hidden"], "not a fixed 1"),
    (shift_batch_axis, ["visible", "hidden"], "batch axis"),
    (shift_in_place, ["visible", "hidden"], "in place"),
    (shift_float, ["visible", "hidden"], "token ids are integers"),
]


@pytest.mark.parametrize(("fn", "failing", "words"), SHIFT_MISTAKES)
def test_shift_mistakes_fail_with_a_message_naming_them(fn, failing, words) -> None:
    assert_fails(SHIFT_CHECKS, fn, failing, words)


def test_shift_calling_the_kit_earns_nothing() -> None:
    outcomes = run_checks(SHIFT_CHECKS, shift_calls_kit)
    assert all("does not allow" in msg for msg in outcomes.values()), outcomes


# ======================================================================================
# sequence_loss
# ======================================================================================

LOSS_CHECKS = {
    "visible": lab06.check_sequence_loss,
    "hidden": lambda fn: hidden06.hidden_check_sequence_loss(fn, seed=621),
    "numerics": lambda fn: hidden06.hidden_check_sequence_loss_numerics(fn, seed=622),
}


def _nll(logits, targets):
    return -logits.float().log_softmax(-1).gather(-1, targets[..., None]).squeeze(-1)  # (B, T)


def loss_gather(logits, targets, pad_id):
    real = targets != pad_id
    return _nll(logits, targets)[real].sum() / real.sum()


def loss_logsumexp(logits, targets, pad_id):
    x = logits.double()
    lp = x - torch.logsumexp(x, dim=-1, keepdim=True)
    picked = lp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    mask = (targets != pad_id).double()
    return (-(picked * mask).sum() / mask.sum()).float()


def loss_one_hot(logits, targets, pad_id):
    lp = logits.float() - logits.float().logsumexp(-1, keepdim=True)
    picked = (lp * F.one_hot(targets, logits.shape[-1])).sum(-1)
    keep = (targets != pad_id).float()
    return -(picked * keep).sum() / keep.sum()


def loss_loops(logits, targets, pad_id):
    total, count = logits.new_zeros((), dtype=torch.float32), 0
    for b in range(targets.shape[0]):
        for t in range(targets.shape[1]):
            if int(targets[b, t]) != pad_id:
                row = logits[b, t].float()
                total = total - (row[targets[b, t]] - torch.logsumexp(row, 0))
                count += 1
    return total / count


def loss_counts_padding(logits, targets, pad_id):
    return _nll(logits, targets).mean()


def loss_sum(logits, targets, pad_id):
    return _nll(logits, targets)[targets != pad_id].sum()


def loss_mean_of_means(logits, targets, pad_id):
    real = (targets != pad_id).float()
    return ((_nll(logits, targets) * real).sum(1) / real.sum(1)).mean()


def loss_all_positions(logits, targets, pad_id):
    real = (targets != pad_id).float()
    return (_nll(logits, targets) * real).sum() / targets.numel()


def loss_time_softmax(logits, targets, pad_id):
    nll = -logits.log_softmax(1).gather(-1, targets[..., None]).squeeze(-1)
    return nll[targets != pad_id].mean()


def loss_no_minus(logits, targets, pad_id):
    return -loss_gather(logits, targets, pad_id)


def loss_probabilities(logits, targets, pad_id):
    p = logits.softmax(-1).gather(-1, targets[..., None]).squeeze(-1)
    return -p[targets != pad_id].mean()


def loss_pad_zero(logits, targets, pad_id):
    return loss_gather(logits, targets, 0)


def loss_log_of_softmax(logits, targets, pad_id):
    p = torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True)
    nll = -torch.log(p).gather(-1, targets[..., None]).squeeze(-1)
    return nll[targets != pad_id].mean()


def loss_item(logits, targets, pad_id):
    return loss_gather(logits, targets, pad_id).item()


def loss_cross_entropy(logits, targets, pad_id):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=pad_id)


def loss_nll(logits, targets, pad_id):
    return F.nll_loss(logits.log_softmax(-1).flatten(0, 1), targets.flatten(), ignore_index=pad_id)


def loss_calls_kit(logits, targets, pad_id):
    return kit_seq2seq.sequence_loss(logits, targets, pad_id)


@pytest.mark.parametrize("fn", [loss_gather, loss_logsumexp, loss_one_hot, loss_loops])
def test_correct_losses_pass_every_check(fn) -> None:
    assert run_checks(LOSS_CHECKS, fn) == dict.fromkeys(LOSS_CHECKS, "")


LOSS_MISTAKES = [
    (loss_counts_padding, ["visible", "hidden", "numerics"], "padding"),
    (loss_sum, ["visible", "hidden", "numerics"], "SUM over the real tokens"),
    (loss_mean_of_means, ["visible", "hidden", "numerics"], "per-sentence means"),
    (loss_all_positions, ["visible", "hidden", "numerics"], "ALL positions (B * T)"),
    (loss_time_softmax, ["visible", "hidden", "numerics"], "time axis"),
    (loss_no_minus, ["visible", "hidden", "numerics"], "minus sign"),
    (loss_probabilities, ["visible", "hidden", "numerics"], "-log-probability"),
    (loss_pad_zero, ["visible", "hidden", "numerics"], "ignores id 0"),
    (loss_log_of_softmax, ["numerics"], "logsumexp"),
    (loss_item, ["visible", "hidden", "numerics"], "should be a torch.Tensor, got float"),
]


@pytest.mark.parametrize(("fn", "failing", "words"), LOSS_MISTAKES)
def test_loss_mistakes_fail_with_a_message_naming_them(fn, failing, words) -> None:
    assert_fails(LOSS_CHECKS, fn, failing, words)


@pytest.mark.parametrize("fn", [loss_cross_entropy, loss_nll, loss_calls_kit])
def test_loss_calling_torch_or_the_kit_earns_nothing(fn) -> None:
    outcomes = run_checks(LOSS_CHECKS, fn)
    assert all("does not allow" in msg for msg in outcomes.values()), outcomes


def test_shift_oracle_agrees_with_the_kit() -> None:
    targets = torch.randint(0, 9, (3, 5), generator=torch.Generator().manual_seed(4))
    got = kit_seq2seq.shift_right(targets, 4)
    assert got.dtype == targets.dtype
    assert torch.equal(got.double(), hidden06.oracle_shift_right(targets, 4))


def test_loss_oracle_agrees_with_the_kit() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 4, 6, generator=g, dtype=torch.float64)
    targets = torch.tensor([[1, 2, 3, 0], [4, 0, 0, 0], [5, 5, 5, 5]])
    torch.testing.assert_close(
        hidden06.oracle_sequence_loss(logits, targets, 0),
        kit_seq2seq.sequence_loss(logits, targets, 0).double(),
    )


# ======================================================================================
# TranslationModule
# ======================================================================================


def _factor(step: int, warmup: int, total: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


class Module(L.LightningModule):
    """The notebook's TranslationModule (the given __init__ and forward, and the answers)."""

    def __init__(self, model, pad_id, lr=3e-3, warmup_steps=50, total_steps=500):
        super().__init__()
        self.model = model
        self.pad_id, self.lr = pad_id, lr
        self.warmup_steps, self.total_steps = warmup_steps, total_steps
        vocab = model.config.tgt_vocab_size
        self.val_acc = MulticlassAccuracy(vocab, average="micro", ignore_index=pad_id)
        self.val_exact_match = MulticlassExactMatch(vocab, ignore_index=pad_id)

    def forward(self, batch):
        return self.model(
            batch["src"],
            batch["tgt_in"],
            src_padding_mask=batch["src_padding_mask"],
            tgt_padding_mask=batch["tgt_padding_mask"],
        )

    def loss(self, logits, targets):
        return loss_gather(logits, targets, self.pad_id)

    def training_step(self, batch, batch_idx):
        loss = self.loss(self(batch), batch["tgt_out"])
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        logits = self(batch)
        predictions = logits.argmax(dim=-1)
        self.val_acc(predictions, batch["tgt_out"])
        self.val_exact_match(predictions, batch["tgt_out"])
        self.log("val_loss", self.loss(logits, batch["tgt_out"]))
        self.log("val_acc", self.val_acc)
        self.log("val_exact_match", self.val_exact_match)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr)
        w, n = self.warmup_steps, self.total_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _factor(s, w, n))
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }


class ModuleLinearDecayDict(Module):
    """Other correct forms: a dict per step, linear decay, list return, log_dict, kit LayerNorm."""

    def training_step(self, batch, batch_idx):
        loss = self.loss(self(batch), batch["tgt_out"])
        self.log_dict({"train_loss": loss})
        return {"loss": loss}

    def validation_step(self, batch, batch_idx):
        logits = self(batch)
        self.val_acc.update(logits.argmax(-1), batch["tgt_out"])
        self.val_exact_match.update(logits.argmax(-1), batch["tgt_out"])
        self.log_dict(
            {
                "val_loss": self.loss(logits, batch["tgt_out"]),
                "val_acc": self.val_acc,
                "val_exact_match": self.val_exact_match,
            }
        )

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.lr)
        w, n = self.warmup_steps, self.total_steps

        def factor(step):
            if step < w:
                return step / w
            return max(0.0, (n - step) / (n - w))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return [optimizer], [{"scheduler": scheduler, "interval": "step"}]


class ModuleSequential(Module):
    """Warm-up and decay from torch's own schedulers, chained."""

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr)
        w, n = self.warmup_steps, self.total_steps
        warm = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0 / w, 1.0, total_iters=w)
        decay = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, n - w)
        scheduler = torch.optim.lr_scheduler.SequentialLR(optimizer, [warm, decay], [w])
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }


class ModuleFeedsTgtOut(Module):
    def training_step(self, batch, batch_idx):
        batch = {**batch, "tgt_in": batch["tgt_out"]}
        return super().training_step(batch, batch_idx)


class ModuleTargetsTgtIn(Module):
    def training_step(self, batch, batch_idx):
        loss = self.loss(self(batch), batch["tgt_in"])
        self.log("train_loss", loss)
        return loss


class ModuleCountsPadding(Module):
    def loss(self, logits, targets):
        return loss_counts_padding(logits, targets, self.pad_id)


class ModulePadZero(Module):
    def loss(self, logits, targets):
        return loss_gather(logits, targets, 0)


class ModuleNoMasks(Module):
    def forward(self, batch):
        return self.model(batch["src"], batch["tgt_in"])


class ModuleReturnsItem(Module):
    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx).item()


class ModuleReturnsDetached(Module):
    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx).detach()


class ModuleNoLog(Module):
    def training_step(self, batch, batch_idx):
        return self.loss(self(batch), batch["tgt_out"])


class ModuleKeepsGraph(Module):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.losses = [*getattr(self, "losses", []), loss]
        return loss


class ModuleEnableGraph(Module):
    def training_step(self, batch, batch_idx):
        loss = self.loss(self(batch), batch["tgt_out"])
        self.log("train_loss", loss, enable_graph=True)
        return loss


class ModuleExactMatchWithPadding(Module):
    def validation_step(self, batch, batch_idx):
        logits = self(batch)
        predictions = logits.argmax(dim=-1)
        self.val_acc(predictions, batch["tgt_out"])
        self.log("val_loss", self.loss(logits, batch["tgt_out"]))
        self.log("val_acc", self.val_acc)
        exact = (predictions == batch["tgt_out"]).all(-1).float().mean()
        self.log("val_exact_match", exact, batch_size=len(predictions))


class ModuleBatchAccuracy(Module):
    def validation_step(self, batch, batch_idx):
        logits = self(batch)
        predictions = logits.argmax(dim=-1)
        self.log("val_loss", self.loss(logits, batch["tgt_out"]))
        self.log("val_acc", self.val_acc(predictions, batch["tgt_out"]))
        self.val_exact_match(predictions, batch["tgt_out"])
        self.log("val_exact_match", self.val_exact_match)


class ModuleNeverReset(Module):
    def validation_step(self, batch, batch_idx):
        logits = self(batch)
        predictions = logits.argmax(dim=-1)
        self.val_acc.update(predictions, batch["tgt_out"])
        self.val_exact_match.update(predictions, batch["tgt_out"])
        self.log("val_loss", self.loss(logits, batch["tgt_out"]))
        self.log("val_acc", self.val_acc)
        if batch_idx == 2:  # the last batch: log the running value once
            self.log("val_exact_match", self.val_exact_match.compute(), reduce_fx="max")


class ModuleComputesEveryStep(Module):
    def validation_step(self, batch, batch_idx):
        logits = self(batch)
        predictions = logits.argmax(dim=-1)
        self.val_acc.update(predictions, batch["tgt_out"])
        self.val_exact_match.update(predictions, batch["tgt_out"])
        self.log("val_loss", self.loss(logits, batch["tgt_out"]))
        self.log("val_acc", self.val_acc.compute())
        self.log("val_exact_match", self.val_exact_match.compute())


class ModuleValLossPadding(Module):
    def validation_step(self, batch, batch_idx):
        logits = self(batch)
        predictions = logits.argmax(dim=-1)
        self.val_acc(predictions, batch["tgt_out"])
        self.val_exact_match(predictions, batch["tgt_out"])
        self.log("val_loss", loss_counts_padding(logits, batch["tgt_out"], self.pad_id))
        self.log("val_acc", self.val_acc)
        self.log("val_exact_match", self.val_exact_match)


class ModuleNoExactMatch(Module):
    def validation_step(self, batch, batch_idx):
        logits = self(batch)
        self.val_acc(logits.argmax(-1), batch["tgt_out"])
        self.log("val_loss", self.loss(logits, batch["tgt_out"]))
        self.log("val_acc", self.val_acc)


class ModuleArgmaxTime(Module):
    def validation_step(self, batch, batch_idx):
        logits = self(batch)
        predictions = logits.argmax(dim=1)
        self.val_acc(predictions, batch["tgt_out"])
        self.log("val_acc", self.val_acc)


def _with_schedule(name, factor):
    """A module whose scheduler multiplies lr by ``factor(self, step, warmup, total)``, named
    ``name`` (its id in the catalogue of mistakes)."""

    class M(Module):
        def configure_optimizers(self):
            optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr)
            w, n = self.warmup_steps, self.total_steps
            scheduler = torch.optim.lr_scheduler.LambdaLR(
                optimizer, lambda s: factor(self, s, w, n)
            )
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
            }

    M.__name__ = M.__qualname__ = name
    return M


ModuleConstant = _with_schedule("ModuleConstant", lambda self, s, w, n: 1.0)
ModuleDecayOnly = _with_schedule(
    "ModuleDecayOnly", lambda self, s, w, n: 0.5 * (1 + math.cos(math.pi * min(1.0, s / n)))
)
ModuleWarmupOnly = _with_schedule("ModuleWarmupOnly", lambda self, s, w, n: min(1.0, (s + 1) / w))
ModuleFactorIsLr = _with_schedule(
    "ModuleFactorIsLr", lambda self, s, w, n: self.lr * _factor(s, w, n)
)
ModuleWarmup100 = _with_schedule(
    "ModuleWarmup100", lambda self, s, w, n: _factor(s, 100, max(n, 101))
)


class ModuleHardCodedLr(Module):
    def configure_optimizers(self):
        out = super().configure_optimizers()
        for group in out["optimizer"].param_groups:
            group["initial_lr"] = group["lr"] = 1e-3
        out["lr_scheduler"]["scheduler"].base_lrs = [1e-3]
        return out


class ModuleSubset(Module):
    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(list(self.parameters())[1:], lr=self.lr)
        w, n = self.warmup_steps, self.total_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _factor(s, w, n))
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }


class ModulePerEpoch(Module):
    def configure_optimizers(self):
        out = super().configure_optimizers()
        return [out["optimizer"]], [out["lr_scheduler"]["scheduler"]]


class ModuleNoScheduler(Module):
    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


class ModuleUsesTrainer(Module):
    def configure_optimizers(self):
        self.total_steps = self.trainer.estimated_stepping_batches
        return super().configure_optimizers()


class ModuleCallsKitLoss(Module):
    def loss(self, logits, targets):
        return kit_seq2seq.sequence_loss(logits, targets, self.pad_id)


class ModuleCallsKitSchedule(Module):
    def configure_optimizers(self):
        from transformer_lab.training.schedule import warmup_cosine_scheduler

        optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr)
        scheduler = warmup_cosine_scheduler(optimizer, self.warmup_steps, self.total_steps)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }


MODULE_CHECKS = {
    "training_step": lab06.check_training_step,
    "validation_step": lab06.check_validation_step,
    "configure_optimizers": lab06.check_configure_optimizers,
    "hidden": lambda c: hidden06.hidden_check_translation_module(c, seed=631),
}


@pytest.mark.parametrize("cls", [Module, ModuleLinearDecayDict, ModuleSequential])
def test_correct_modules_pass_every_check(cls) -> None:
    assert run_checks(MODULE_CHECKS, cls) == dict.fromkeys(MODULE_CHECKS, "")


TRAIN = ["training_step", "hidden"]
VALIDATION = ["validation_step", "hidden"]
OPTIM = ["configure_optimizers", "hidden"]
#: What a schedule of the wrong shape reads (the rates it had, then the rule).
SHAPE = "expected a linear rise from near 0 to self.lr at step self.warmup_steps"


MODULE_MISTAKES = [
    (ModuleFeedsTgtOut, TRAIN, "the decoder reading batch['tgt_out']"),
    (ModuleTargetsTgtIn, TRAIN, "the labels are batch['tgt_out']"),
    (
        ModuleCountsPadding,
        [*TRAIN, "validation_step"],
        {**dict.fromkeys(TRAIN, "counts the padding"), "validation_step": "val_loss is"},
    ),
    (ModulePadZero, ["hidden"], "ignores id 0"),
    (
        ModuleNoMasks,
        [*TRAIN, "validation_step"],
        {**dict.fromkeys(TRAIN, "padding masks"), "validation_step": "val_loss is"},
    ),
    (ModuleReturnsItem, TRAIN, "loss.item()"),
    (ModuleReturnsDetached, TRAIN, "without its autograd graph"),
    (ModuleNoLog, TRAIN, "logged nothing"),
    (ModuleKeepsGraph, TRAIN, "self.losses[0] holds a tensor with its autograd"),
    (ModuleEnableGraph, TRAIN, "keeps the step's whole autograd graph"),
    (ModuleExactMatchWithPadding, VALIDATION, "val_exact_match is"),
    (ModuleBatchAccuracy, VALIDATION, "val_acc is"),
    (ModuleNeverReset, VALIDATION, "(second run, other sentences)"),
    (ModuleComputesEveryStep, VALIDATION, "expected"),
    (ModuleValLossPadding, VALIDATION, "val_loss is"),
    (ModuleNoExactMatch, VALIDATION, "not 'val_exact_match'"),
    (ModuleArgmaxTime, VALIDATION, "validation_step"),
    (ModuleConstant, OPTIM, SHAPE),
    (ModuleDecayOnly, OPTIM, SHAPE),
    (ModuleWarmupOnly, OPTIM, SHAPE),
    (ModuleFactorIsLr, OPTIM, SHAPE),
    (ModuleWarmup100, OPTIM, SHAPE),
    (ModuleHardCodedLr, OPTIM, SHAPE),
    (ModuleSubset, OPTIM, "leaves out"),
    (ModulePerEpoch, OPTIM, "once per EPOCH"),
    (ModuleNoScheduler, OPTIM, "without a learning-rate scheduler"),
    (ModuleUsesTrainer, OPTIM, "self.total_steps"),
]


@pytest.mark.parametrize(("cls", "failing", "words"), MODULE_MISTAKES)
def test_module_mistakes_fail_with_a_message_naming_them(cls, failing, words) -> None:
    assert_fails(MODULE_CHECKS, cls, failing, words)


@pytest.mark.parametrize("cls", [ModuleCallsKitLoss, ModuleCallsKitSchedule])
def test_module_calling_the_kit_earns_nothing(cls) -> None:
    outcomes = run_checks(MODULE_CHECKS, cls)
    assert any("does not allow" in msg for msg in outcomes.values()), outcomes
    assert outcomes["hidden"], outcomes


# ======================================================================================
# train_translator
# ======================================================================================


@pytest.fixture()
def session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Session:
    monkeypatch.chdir(tmp_path)  # a default logger would write ./lightning_logs here
    return Session(
        "06_decoder_training", torch.device("cpu"), "grading", "32-true", 1, tmp_path / "runs"
    )


def _trainer_for(session, max_steps, name, **overrides):
    options = dict(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        precision=session.precision,
        logger=CSVLogger(session.runs, name=name),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        val_check_interval=max(1, max_steps // 4),
        check_val_every_n_epoch=None,
    )
    options.update(overrides)
    return L.Trainer(**options)


def train(module, datamodule, *, max_steps, session, name="translator"):
    trainer = _trainer_for(session, max_steps, name)
    trainer.fit(module, datamodule=datamodule)
    return trainer


def train_default_validation(module, datamodule, *, max_steps, session, name="translator"):
    trainer = _trainer_for(
        session, max_steps, name, val_check_interval=None, check_val_every_n_epoch=1
    )
    trainer.fit(module, datamodule=datamodule)
    return trainer


def train_epochs(module, datamodule, *, max_steps, session, name="translator"):
    trainer = _trainer_for(
        session, -1, name, max_epochs=1, val_check_interval=1.0, check_val_every_n_epoch=1
    )
    trainer.fit(module, datamodule=datamodule)
    return trainer


def train_fixed_precision(module, datamodule, *, max_steps, session, name="translator"):
    trainer = _trainer_for(session, max_steps, name, precision="32-true")
    trainer.fit(module, datamodule=datamodule)
    return trainer


def train_fixed_bf16(module, datamodule, *, max_steps, session, name="translator"):
    trainer = _trainer_for(session, max_steps, name, precision="bf16-mixed")
    trainer.fit(module, datamodule=datamodule)
    return trainer


def train_default_logger(module, datamodule, *, max_steps, session, name="translator"):
    trainer = _trainer_for(session, max_steps, name, logger=CSVLogger("logs", name=name))
    trainer.fit(module, datamodule=datamodule)
    return trainer


def train_no_logger(module, datamodule, *, max_steps, session, name="translator"):
    trainer = _trainer_for(session, max_steps, name, logger=False)
    trainer.fit(module, datamodule=datamodule)
    return trainer


def train_unnamed(module, datamodule, *, max_steps, session, name="translator"):
    trainer = _trainer_for(session, max_steps, name, logger=CSVLogger(session.runs))
    trainer.fit(module, datamodule=datamodule)
    return trainer


def train_without_validation(module, datamodule, *, max_steps, session, name="translator"):
    trainer = _trainer_for(session, max_steps, name)
    trainer.fit(module, train_dataloaders=datamodule.train_dataloader())
    return trainer


def train_returns_nothing(module, datamodule, *, max_steps, session, name="translator"):
    train(module, datamodule, max_steps=max_steps, session=session, name=name)


def train_new_module(module, datamodule, *, max_steps, session, name="translator"):
    return train(type(module)(), datamodule, max_steps=max_steps, session=session, name=name)


def _train_checks(session):
    return {
        "visible": lambda fn: lab06.check_train_translator(fn, session),
        "hidden": lambda fn: hidden06.hidden_check_train_translator(fn, session, seed=641),
    }


@pytest.mark.parametrize("fn", [train, train_default_validation])
def test_correct_train_translators_pass(session, fn) -> None:
    # Lightning also validates when max_steps ends the run in the middle of an epoch.
    assert run_checks(_train_checks(session), fn) == {"visible": "", "hidden": ""}


#: (a wrong train_translator, the checks that must fail, words their messages must hold)
TRAIN_MISTAKES = [
    (train_epochs, ["visible", "hidden"], "training steps of the module given 64"),
    (train_fixed_precision, ["visible", "hidden"], "precision '32-true', expected 'bf16-mixed'"),
    (train_fixed_bf16, ["visible", "hidden"], "precision 'bf16-mixed', expected '32-true'"),
    (train_default_logger, ["visible", "hidden"], "logs in"),
    (train_no_logger, ["visible", "hidden"], "logs in None"),
    (train_unnamed, ["visible", "hidden"], "lightning_logs'"),
    (train_without_validation, ["visible", "hidden"], "validated during the run False"),
    (train_returns_nothing, ["visible", "hidden"], "returned 'NoneType'"),
    (train_new_module, ["visible", "hidden"], "training steps of the module given 0"),
]


@pytest.mark.parametrize(("fn", "failing", "words"), TRAIN_MISTAKES)
def test_train_translator_mistakes_fail_with_a_message_naming_them(
    session, fn, failing, words
) -> None:
    assert_fails(_train_checks(session), fn, failing, words)


# ======================================================================================
# greedy_decode
# ======================================================================================

DECODE_CHECKS = {
    "visible": lab06.check_greedy_decode,
    "hidden": lambda fn: hidden06.hidden_check_greedy_decode(fn, seed=651),
    "edges": lambda fn: hidden06.hidden_check_greedy_decode_edges(fn, seed=652),
}


def greedy_batched(model, src, bos_id, eos_id, max_len, src_padding_mask=None):
    pad_id = model.config.pad_id
    memory = model.encode(src, src_padding_mask)
    ys = torch.full((src.shape[0], 1), bos_id, dtype=torch.long)
    done = torch.zeros(src.shape[0], dtype=torch.bool)
    while ys.shape[1] < max_len and not bool(done.all()):
        nxt = model.decode(ys, memory, src_padding_mask)[:, -1].argmax(-1)
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
        ys = torch.cat([ys, nxt[:, None]], dim=1)
        done = done | (nxt == eos_id)
    return ys


@torch.no_grad()
def greedy_preallocated(model, src, bos_id, eos_id, max_len, src_padding_mask=None):
    memory = model.encode(src, src_padding_mask)
    out = torch.full((src.shape[0], max_len), model.config.pad_id, dtype=torch.long)
    out[:, 0] = bos_id
    finished = torch.zeros(src.shape[0], dtype=torch.bool)
    length = 1
    for step in range(1, max_len):
        if finished.all():
            break
        logits = model.decode(out[:, :step], memory, src_padding_mask)
        token = logits[:, step - 1, :].argmax(dim=-1)
        out[~finished, step] = token[~finished]
        finished |= token == eos_id
        length = step + 1
    return out[:, :length]


def greedy_no_pad_after_eos(model, src, bos_id, eos_id, max_len, src_padding_mask=None):
    memory = model.encode(src, src_padding_mask)
    ys = torch.full((src.shape[0], 1), bos_id, dtype=torch.long)
    while ys.shape[1] < max_len and not bool((ys == eos_id).any(1).all()):
        nxt = model.decode(ys, memory, src_padding_mask)[:, -1].argmax(-1)
        ys = torch.cat([ys, nxt[:, None]], dim=1)
    return ys


def greedy_never_stops(model, src, bos_id, eos_id, max_len, src_padding_mask=None):
    memory = model.encode(src, src_padding_mask)
    ys = torch.full((src.shape[0], 1), bos_id, dtype=torch.long)
    done = torch.zeros(src.shape[0], dtype=torch.bool)
    while ys.shape[1] < max_len:
        nxt = model.decode(ys, memory, src_padding_mask)[:, -1].argmax(-1)
        nxt = nxt.masked_fill(done, model.config.pad_id)
        ys = torch.cat([ys, nxt[:, None]], dim=1)
        done |= nxt == eos_id
    return ys


def greedy_stops_at_first(model, src, bos_id, eos_id, max_len, src_padding_mask=None):
    memory = model.encode(src, src_padding_mask)
    ys = torch.full((src.shape[0], 1), bos_id, dtype=torch.long)
    while ys.shape[1] < max_len:
        nxt = model.decode(ys, memory, src_padding_mask)[:, -1].argmax(-1)
        ys = torch.cat([ys, nxt[:, None]], dim=1)
        if bool((nxt == eos_id).any()):
            break
    return ys


def greedy_first_position(model, src, bos_id, eos_id, max_len, src_padding_mask=None):
    memory = model.encode(src, src_padding_mask)
    ys = torch.full((src.shape[0], 1), bos_id, dtype=torch.long)
    done = torch.zeros(src.shape[0], dtype=torch.bool)
    while ys.shape[1] < max_len and not bool(done.all()):
        nxt = model.decode(ys, memory, src_padding_mask)[:, 0].argmax(-1)
        nxt = nxt.masked_fill(done, model.config.pad_id)
        ys = torch.cat([ys, nxt[:, None]], dim=1)
        done |= nxt == eos_id
    return ys


def greedy_drops_bos(model, src, bos_id, eos_id, max_len, src_padding_mask=None):
    return greedy_batched(model, src, bos_id, eos_id, max_len, src_padding_mask)[:, 1:]


def greedy_max_len_new_tokens(model, src, bos_id, eos_id, max_len, src_padding_mask=None):
    return greedy_batched(model, src, bos_id, eos_id, max_len + 1, src_padding_mask)


def greedy_ignores_mask(model, src, bos_id, eos_id, max_len, src_padding_mask=None):
    return greedy_batched(model, src, bos_id, eos_id, max_len)


def greedy_mask_in_encode_only(model, src, bos_id, eos_id, max_len, src_padding_mask=None):
    memory = model.encode(src, src_padding_mask)
    ys = torch.full((src.shape[0], 1), bos_id, dtype=torch.long)
    done = torch.zeros(src.shape[0], dtype=torch.bool)
    while ys.shape[1] < max_len and not bool(done.all()):
        nxt = model.decode(ys, memory)[:, -1].argmax(-1)
        nxt = nxt.masked_fill(done, model.config.pad_id)
        ys = torch.cat([ys, nxt[:, None]], dim=1)
        done |= nxt == eos_id
    return ys


def greedy_fills_eos(model, src, bos_id, eos_id, max_len, src_padding_mask=None):
    out = greedy_batched(model, src, bos_id, eos_id, max_len, src_padding_mask)
    ended = (out == eos_id).long().cumsum(1) > 0
    after = ended & ~(out == eos_id) | (ended.long().cumsum(1) > 1)
    return out.masked_fill(after, eos_id)


def greedy_fills_zero(model, src, bos_id, eos_id, max_len, src_padding_mask=None):
    out = greedy_batched(model, src, bos_id, eos_id, max_len, src_padding_mask)
    return out.masked_fill(out == model.config.pad_id, 0)


def greedy_feeds_logits(model, src, bos_id, eos_id, max_len, src_padding_mask=None):
    memory = model.encode(src, src_padding_mask)
    ys = torch.full((src.shape[0], 1), float(bos_id))
    while ys.shape[1] < max_len:
        logits = model.decode(ys, memory, src_padding_mask)[:, -1]
        ys = torch.cat([ys, logits.max(-1, keepdim=True).values], dim=1)
    return ys.long()


def greedy_encodes_every_step(model, src, bos_id, eos_id, max_len, src_padding_mask=None):
    ys = torch.full((src.shape[0], 1), bos_id, dtype=torch.long)
    done = torch.zeros(src.shape[0], dtype=torch.bool)
    while ys.shape[1] < max_len and not bool(done.all()):
        memory = model.encode(src, src_padding_mask)
        nxt = model.decode(ys, memory, src_padding_mask)[:, -1].argmax(-1)
        nxt = nxt.masked_fill(done, model.config.pad_id)
        ys = torch.cat([ys, nxt[:, None]], dim=1)
        done |= nxt == eos_id
    return ys


def greedy_samples(model, src, bos_id, eos_id, max_len, src_padding_mask=None):
    torch.manual_seed(0)
    memory = model.encode(src, src_padding_mask)
    ys = torch.full((src.shape[0], 1), bos_id, dtype=torch.long)
    done = torch.zeros(src.shape[0], dtype=torch.bool)
    while ys.shape[1] < max_len and not bool(done.all()):
        probs = model.decode(ys, memory, src_padding_mask)[:, -1].softmax(-1)
        nxt = torch.multinomial(probs, 1)[:, 0].masked_fill(done, model.config.pad_id)
        ys = torch.cat([ys, nxt[:, None]], dim=1)
        done |= nxt == eos_id
    return ys


def greedy_calls_kit(model, src, bos_id, eos_id, max_len, src_padding_mask=None):
    return kit_generation.greedy_decode(model, src, bos_id, eos_id, max_len, src_padding_mask)


@pytest.mark.parametrize("fn", [greedy_batched, greedy_preallocated])
def test_correct_decoders_pass_every_check(fn) -> None:
    assert run_checks(DECODE_CHECKS, fn) == dict.fromkeys(DECODE_CHECKS, "")


DECODE_MISTAKES = [
    (
        greedy_no_pad_after_eos,
        ["visible", "hidden", "edges"],
        "must go on with model.config.pad_id",
    ),
    (greedy_never_stops, ["visible", "hidden", "edges"], "went on to max_len"),
    (greedy_stops_at_first, ["visible", "hidden", "edges"], "FIRST sentence produced EOS"),
    (greedy_first_position, ["visible", "hidden", "edges"], "logits[:, -1]"),
    (greedy_drops_bos, ["visible", "hidden", "edges"], "BOS first"),
    (greedy_max_len_new_tokens, ["visible", "edges"], "max_len counts BOS"),
    (greedy_ignores_mask, ["visible", "hidden", "edges"], "ignore src_padding_mask"),
    (greedy_mask_in_encode_only, ["visible", "hidden", "edges"], "ignore src_padding_mask"),
    (greedy_fills_eos, ["visible", "hidden", "edges"], "not with eos_id"),
    (greedy_fills_zero, ["hidden", "edges"], "not with 0"),
    (greedy_feeds_logits, ["visible", "hidden", "edges"], "not the logits"),
    (greedy_encodes_every_step, ["visible", "hidden", "edges"], "Encode the source once"),
]


@pytest.mark.parametrize(("fn", "failing", "words"), DECODE_MISTAKES)
def test_decode_mistakes_fail_with_a_message_naming_them(fn, failing, words) -> None:
    assert_fails(DECODE_CHECKS, fn, failing, words)


def test_decode_sampling_instead_of_argmax_fails() -> None:
    # Which sentence a sample spoils varies; the checks fail it, without naming it.
    assert all(run_checks(DECODE_CHECKS, greedy_samples).values())


def test_decode_calling_the_kit_earns_nothing() -> None:
    outcomes = run_checks(DECODE_CHECKS, greedy_calls_kit)
    assert all("does not allow" in msg for msg in outcomes.values()), outcomes


def test_decode_oracle_agrees_with_the_kit() -> None:
    model = lab06.StandInTranslator(9, seed=3)
    src = torch.randint(3, 9, (4, 5), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(src, dtype=torch.bool)
    mask[1, 2:] = False
    want = hidden06.oracle_greedy_decode(model, src, 1, 2, 8, mask)
    got = kit_generation.greedy_decode(model, src, 1, 2, 8, src_padding_mask=mask)
    assert torch.equal(got.double(), want)


# ======================================================================================
# The trained translator's checks
# ======================================================================================


@functools.cache
def trained_translator(block: type) -> tuple[nn.Module, Any]:
    """A small translator of ``block``s (one per side, d_model 32) trained on the grammar for 200
    steps, as the notebook's training cell does but shorter (>= 0.9 exactly right), and its
    DataModule; trained once per block class and test process."""
    from transformer_lab.data import GrammarDataModule
    from transformer_lab.models import Seq2SeqConfig, Seq2SeqTransformer
    from transformer_lab.training.modules import OptimConfig, Seq2SeqModule

    dm = GrammarDataModule(num_train=2000, num_val=200, batch_size=64)
    dm.setup()
    torch.manual_seed(0)
    sizes = {"src_vocab_size": dm.src_vocab_size, "tgt_vocab_size": dm.tgt_vocab_size}
    layers = {"n_encoder_layers": 1, "n_decoder_layers": 1}
    config = Seq2SeqConfig(**sizes, **layers, max_len=dm.max_len, d_model=32, d_ff=64)
    model = Seq2SeqTransformer(config, decoder_blocks=[block(32, 4, 64)])
    module = Seq2SeqModule(model=model, optim=OptimConfig(lr=5e-3, warmup_steps=20))
    trainer = L.Trainer(max_steps=200, limit_val_batches=0, **BARE)
    trainer.fit(module, datamodule=dm)
    return model, dm


def test_trained_translator_checks_accept_a_trained_kit_model_and_refuse_an_untrained_one() -> None:
    from transformer_lab.models import Seq2SeqTransformer

    model, dm = trained_translator(Block)
    untrained = Seq2SeqTransformer(model.config, decoder_blocks=[Block(32, 4, 64)])
    with pytest.raises(AssertionError, match="exactly right"):
        lab06.check_trained_translator(untrained, dm, Block)
    with pytest.raises(AssertionError, match="your DecoderBlock"):
        lab06.check_trained_translator(untrained, dm, BlockFused)
    assert lab06.check_trained_translator(model, dm, Block) >= 0.9
    hidden06.hidden_check_translator_greedy(model, dm, seed=642)


def test_the_demos_attention_maps_end_with_the_last_blocks_cross_attention() -> None:
    from transformer_lab.models import Seq2SeqConfig, Seq2SeqTransformer
    from transformer_lab.plots import collect_attention

    config = Seq2SeqConfig(src_vocab_size=9, tgt_vocab_size=9, d_model=16, n_decoder_layers=2)
    model = Seq2SeqTransformer(config, decoder_blocks=[Block(16, 4, 32), BlockFused(16, 4, 32)])
    src, tgt = torch.randint(3, 9, (2, 6)), torch.randint(3, 9, (2, 4))
    maps = collect_attention(model.eval(), src, tgt)
    assert tuple(maps[-1].shape) == (2, 4, 4, 6)
    torch.testing.assert_close(maps[-1].sum(-1), torch.ones(2, 4, 4))


def test_stand_in_models_record_and_refuse_what_they_should() -> None:
    model = lab06.StandInTranslator(scripted=True)
    memory = model.encode(torch.tensor([[4, 5]]))
    with pytest.raises(AssertionError, match="float values"):
        model.decode(torch.tensor([[1.0]]), memory)
    assert model.encode_calls == 1
    tiny = lab06.StandInTranslator(seed=62)
    batch = lab06.copy_task_batch(32, tiny.config, seed=62)
    masks = (batch["src_padding_mask"], batch["tgt_padding_mask"])
    logits = tiny(batch["src"], batch["tgt_in"], *masks)
    right = logits.argmax(-1) == batch["tgt_out"]
    accuracy = right[batch["tgt_out"] != 0].float().mean()
    exact = (right | (batch["tgt_out"] == 0)).all(-1).float().mean()
    # Partly right: metrics that are neither 0 nor 1 tell correct code from wrong code.
    assert 0.4 < float(accuracy) < 0.95 and 0.05 < float(exact) < 0.8
    assert tiny.encode_calls == 1
    assert dataclasses.is_dataclass(Session)
