"""Whole models built from the package's blocks: an encoder classifier, an encoder-decoder
(seq2seq) Transformer, and a decoder-only GPT with a KV cache.

* :class:`EncoderClassifier` -- token embeddings, positions, a stack of :class:`EncoderBlock`\\ s
  and a linear head, per token (tagging: copy, reverse, sort) or per sequence (mean-pooled over
  real tokens). Accepts student-written blocks so a lab can train its own.
* :class:`Seq2SeqTransformer` -- the architecture of "Attention Is All You Need": an
  :class:`Encoder` over the source and a decoder with causal self-attention and cross-attention
  to the encoder output.
* :class:`GPT` -- GPT-2's layout: learned positions, pre-norm blocks, a final layer norm and an
  output layer tied to the token embedding. Its attention, :class:`CausalSelfAttention`, is the
  kit's :class:`~transformer_lab.attention.MultiHeadAttention` with one fused input projection:
  training uses the fused causal kernel; a :class:`~transformer_lab.attention.KVCache`
  (re-exported here) keeps past keys/values so generation costs one token per step.

Each model has a config dataclass on one validated base, :class:`ModelConfig` (litgpt's
``Config`` style): ``__post_init__`` checks every size once and raises a ``ValueError`` naming
the value, ``from_name`` builds a named preset. The encoder-decoder's encoder reads its own
config (``src_vocab_size``, ``n_encoder_layers``) directly, the same names an
:class:`EncoderConfig` answers to, so no config is copied into another.

Shape letters: ``B`` batch, ``T`` target/time, ``S`` source time, ``D`` width, ``H`` heads,
``Dh`` head width, ``V`` vocabulary, ``C`` classes.

References: Vaswani et al., "Attention Is All You Need", 2017; Devlin et al., "BERT", 2019
(encoders for classification); Radford et al., "Language Models are Unsupervised Multitask
Learners" (GPT-2), 2019; Brown et al., "Language Models are Few-Shot Learners" (GPT-3), 2020.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import torch
from torch import Tensor, nn

from transformer_lab.attention import KVCache, LayerKVCache, MultiHeadAttention, split_heads
from transformer_lab.blocks import ACTIVATIONS, DecoderBlock, EncoderBlock, FeedForward, LayerNorm
from transformer_lab.masks import causal_mask, combine_masks, key_padding_to_attention
from transformer_lab.positional import LearnedPositionalEncoding, SinusoidalPositionalEncoding

__all__ = [
    "GPT",
    "GPT_PRESETS",
    "CausalSelfAttention",
    "Encoder",
    "EncoderClassifier",
    "EncoderConfig",
    "GPTBlock",
    "GPTConfig",
    "KVCache",  # defined in transformer_lab.attention, re-exported for GPT users
    "ModelConfig",
    "Seq2SeqConfig",
    "Seq2SeqTransformer",
]

POSITIONAL_KINDS = ("sinusoidal", "learned", "none")
HEAD_KINDS = ("token", "sequence")


# ----------------------------------------------------------------------------- validation


def _check_positive(**values: int | None) -> None:
    bad = {k: v for k, v in values.items() if v is not None and v < 1}
    if bad:
        listed = ", ".join(f"{k}={v}" for k, v in bad.items())
        raise ValueError(f"{listed}: must be >= 1")


def _check_heads(d_model: int, n_heads: int) -> None:
    if d_model % n_heads != 0:
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")


def _check_dropout(dropout: float) -> None:
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout={dropout} must lie in [0, 1)")


def _check_tokens(tokens: Tensor, max_len: int, name: str = "max_len") -> None:
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be (B, T), got shape {tuple(tokens.shape)}")
    if tokens.shape[1] > max_len:
        raise ValueError(f"sequence length T={tokens.shape[1]} exceeds {name}={max_len}")


def _check_padding(padding_mask: Tensor | None, tokens: Tensor) -> None:
    if padding_mask is None:
        return
    if padding_mask.dtype != torch.bool or padding_mask.shape != tokens.shape:
        raise ValueError(
            f"padding_mask must be bool of shape {tuple(tokens.shape)} (True at real tokens), "
            f"got {padding_mask.dtype} of shape {tuple(padding_mask.shape)}"
        )


class _TokenEmbedding(nn.Module):
    """Token embedding scaled by ``sqrt(D)`` (as in the paper).

    Weights start at ``N(0, 1/D)``, so after the scaling each embedding has unit variance per
    coordinate, the same scale as the sinusoidal table it is added to.
    """

    def __init__(self, vocab_size: int, d_model: int) -> None:
        super().__init__()
        self.scale = math.sqrt(d_model)
        self.embedding = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embedding.weight, 0.0, 1.0 / self.scale)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.embedding(tokens) * self.scale  # (B, T, D)


def _positions(kind: str, d_model: int, max_len: int, dropout: float) -> nn.Module:
    if kind == "sinusoidal":
        return SinusoidalPositionalEncoding(d_model, max_len, dropout=dropout)
    if kind == "learned":
        return LearnedPositionalEncoding(d_model, max_len, dropout=dropout)
    return nn.Dropout(dropout)  # "none": a bag of tokens, permutation-equivariant


# ----------------------------------------------------------------------------- configs

C = TypeVar("C", bound="ModelConfig")


@dataclass
class ModelConfig:
    """The validated base of :class:`EncoderConfig`, :class:`Seq2SeqConfig` and :class:`GPTConfig`.

    Each subclass is a dataclass with at least ``d_model``, ``n_heads``, ``d_ff`` and
    ``dropout``. Its ``__post_init__`` (this one) checks, in order: every size
    (:meth:`size_fields`: the integer fields but the token ids) is ``>= 1`` (``None`` means "the
    default"), ``n_heads`` divides
    ``d_model``, ``dropout`` lies in ``[0, 1)``, ``d_model`` is even under sinusoidal positions
    (a ``positional`` field or class attribute), then the subclass's own :meth:`validate`.
    Every refusal is a ``ValueError`` naming the value (``d_model=10 is not divisible by
    n_heads=4``), which the CLI shows in one line.

    ``presets`` maps names to field values for :meth:`from_name` (litgpt's ``Config.from_name``).
    The base is a dataclass without fields, so LightningCLI and jsonargparse see each config as
    the plain dataclass it is (its fields, YAML and checkpoint form are unchanged).
    """

    #: Integer fields that are token ids, not sizes (every other integer field must be ``>= 1``).
    id_fields: ClassVar[tuple[str, ...]] = ()
    #: Named sizes for :meth:`from_name`.
    presets: ClassVar[dict[str, dict[str, Any]]] = {}
    #: What the presets are called in messages ("GPT preset").
    preset_kind: ClassVar[str] = "preset"

    def __post_init__(self) -> None:
        _check_positive(**{name: getattr(self, name) for name in self.size_fields()})
        _check_heads(self.d_model, self.n_heads)
        _check_dropout(self.dropout)
        if getattr(self, "positional", None) == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"d_model={self.d_model} must be even for sinusoidal positions")
        self.validate()

    @classmethod
    def size_fields(cls) -> tuple[str, ...]:
        """The integer fields that are sizes (all but ``id_fields``), in declaration order."""
        return tuple(
            f.name
            for f in dataclasses.fields(cls)
            if str(f.type) in ("int", "int | None") and f.name not in cls.id_fields
        )

    def validate(self) -> None:
        """Checks of one config's own fields (a subclass's ``ValueError`` names the value)."""

    @property
    def ff_dim(self) -> int:
        """Feed-forward width actually used: ``d_ff``, default ``4 * d_model``."""
        return self.d_ff if self.d_ff is not None else 4 * self.d_model

    @property
    def head_dim(self) -> int:
        """Width of one attention head, ``Dh = D / H``."""
        return self.d_model // self.n_heads

    @classmethod
    def from_name(cls: type[C], name: str, **overrides: Any) -> C:
        """A named preset (see ``presets``), with fields overridden by keyword.

        Raises:
            ValueError: for an unknown name (the message lists the known ones).
        """
        if name not in cls.presets:
            raise ValueError(
                f"unknown {cls.preset_kind} {name!r}; known presets: {sorted(cls.presets)}"
            )
        return cls(**{**cls.presets[name], **overrides})


# ----------------------------------------------------------------------------- encoder


#: Named encoder sizes; pass ``vocab_size=...`` (and ``max_len``) to ``EncoderConfig.from_name``.
ENCODER_PRESETS: dict[str, dict[str, Any]] = {
    # The toy tagging tasks (configs/copy.yaml, reverse.yaml, sort.yaml).
    "tagging-small": dict(d_model=64, n_layers=2, n_heads=4),
    # BERT-base's layout (Devlin et al., 2019), for size arithmetic and the meta device.
    "bert-base": dict(d_model=768, n_layers=12, n_heads=12, max_len=512, vocab_size=30522),
}


@dataclass
class EncoderConfig(ModelConfig):
    """Hyper-parameters of :class:`EncoderClassifier`."""

    vocab_size: int  # number of input token ids
    max_len: int = 64  # longest input sequence
    d_model: int = 64  # model width D
    n_layers: int = 2  # encoder blocks
    n_heads: int = 4  # attention heads; must divide d_model
    d_ff: int | None = None  # feed-forward width, default 4 * d_model
    dropout: float = 0.0  # embeddings, attention weights and residual branches
    norm_first: bool = False  # post-norm ("Add & Norm") by default
    positional: str = "sinusoidal"  # "sinusoidal" | "learned" | "none"
    num_classes: int | None = None  # output classes, default vocab_size
    head: str = "token"  # "token": (B, T, C) | "sequence": (B, C), mean over real tokens

    presets: ClassVar[dict[str, dict[str, Any]]] = ENCODER_PRESETS
    preset_kind: ClassVar[str] = "encoder preset"

    def validate(self) -> None:
        if self.positional not in POSITIONAL_KINDS:
            raise ValueError(f"positional={self.positional!r} is not one of {POSITIONAL_KINDS}")
        if self.head not in HEAD_KINDS:
            raise ValueError(f"head={self.head!r} is not one of {HEAD_KINDS}")

    @property
    def n_classes(self) -> int:
        """Number of outputs of the head."""
        return self.num_classes if self.num_classes is not None else self.vocab_size

    # The encoder side under the names a Seq2SeqConfig gives it, read by :class:`Encoder`.
    @property
    def src_vocab_size(self) -> int:
        """The encoder's input vocabulary: ``vocab_size``."""
        return self.vocab_size

    @property
    def n_encoder_layers(self) -> int:
        """The encoder's depth: ``n_layers``."""
        return self.n_layers


class Encoder(nn.Module):
    """Embeddings, positions and a stack of encoder blocks: tokens ``(B, T)`` to ``(B, T, D)``.

    Args:
        config: sizes and options: an :class:`EncoderConfig`, or the :class:`Seq2SeqConfig`
            of the encoder-decoder this encoder belongs to (both name the encoder's side
            ``src_vocab_size``, ``n_encoder_layers``, ``positional``).
        blocks: optional replacement blocks (e.g. a student's), each ``forward(x, mask=None)``
            with ``mask`` broadcasting to ``(B, H, T, T)``; default ``config.n_layers``
            :class:`EncoderBlock`\\ s.
    """

    def __init__(
        self, config: EncoderConfig | Seq2SeqConfig, blocks: Sequence[nn.Module] | None = None
    ) -> None:
        super().__init__()
        c = config
        self.config = c
        self.embed = _TokenEmbedding(c.src_vocab_size, c.d_model)
        self.positions = _positions(c.positional, c.d_model, c.max_len, c.dropout)
        if blocks is None:
            blocks = [
                EncoderBlock(c.d_model, c.n_heads, c.ff_dim, c.dropout, c.norm_first)
                for _ in range(c.n_encoder_layers)
            ]
        self.blocks = nn.ModuleList(blocks)
        # Pre-norm leaves the residual stream unnormalised: normalise once at the end.
        self.final_norm = LayerNorm(c.d_model) if c.norm_first else nn.Identity()

    def forward(self, tokens: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """Encode.

        Args:
            tokens: ``(B, T)`` token ids, ``T <= max_len``.
            padding_mask: ``(B, T)`` bool, True at real tokens; padded keys are hidden.

        Returns:
            ``(B, T, D)``.
        """
        _check_tokens(tokens, self.config.max_len)
        _check_padding(padding_mask, tokens)
        mask = None if padding_mask is None else key_padding_to_attention(padding_mask)
        x = self.positions(self.embed(tokens))  # (B, T, D)
        for block in self.blocks:
            x = block(x, mask=mask)
        return self.final_norm(x)


class EncoderClassifier(nn.Module):
    """An :class:`Encoder` with a linear head per token or per sequence.

    Args:
        config: sizes, options and ``head`` ("token" or "sequence").
        blocks: optional student blocks, see :class:`Encoder`.
    """

    def __init__(self, config: EncoderConfig, blocks: Sequence[nn.Module] | None = None) -> None:
        super().__init__()
        self.config = config
        self.encoder = Encoder(config, blocks)
        self.head = nn.Linear(config.d_model, config.n_classes)

    def forward(self, tokens: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """Classify.

        Args:
            tokens: ``(B, T)`` token ids.
            padding_mask: ``(B, T)`` bool, True at real tokens.

        Returns:
            Logits ``(B, T, C)`` for the token head, ``(B, C)`` for the sequence head (mean of
            the encoder states over real tokens).
        """
        h = self.encoder(tokens, padding_mask)  # (B, T, D)
        if self.config.head == "token":
            return self.head(h)  # (B, T, C)
        if padding_mask is None:
            pooled = h.mean(dim=1)
        else:
            m = padding_mask.unsqueeze(-1).to(h.dtype)  # (B, T, 1)
            pooled = (h * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)  # (B, D)
        return self.head(pooled)  # (B, C)


# ----------------------------------------------------------------------------- seq2seq


#: Named encoder-decoder sizes; pass the vocabulary sizes to ``Seq2SeqConfig.from_name``.
SEQ2SEQ_PRESETS: dict[str, dict[str, Any]] = {
    # The toy translation of configs/grammar_translation.yaml and lab 06.
    "translation-small": dict(d_model=64, n_encoder_layers=2, n_decoder_layers=2, n_heads=4),
}


@dataclass
class Seq2SeqConfig(ModelConfig):
    """Hyper-parameters of :class:`Seq2SeqTransformer` (sinusoidal positions on both sides)."""

    src_vocab_size: int  # source token ids
    tgt_vocab_size: int  # target token ids (the output layer's size)
    max_len: int = 64  # longest source or target sequence
    d_model: int = 64  # model width D (even: sinusoidal positions)
    n_encoder_layers: int = 2  # encoder blocks
    n_decoder_layers: int = 2  # decoder blocks
    n_heads: int = 4  # attention heads; must divide d_model
    d_ff: int | None = None  # feed-forward width, default 4 * d_model
    dropout: float = 0.0  # embeddings, attention weights and residual branches
    norm_first: bool = False  # post-norm by default
    pad_id: int = 0  # padding token id (both vocabularies)
    bos_id: int = 1  # beginning-of-sequence id, starts every decoder input
    eos_id: int = 2  # end-of-sequence id

    #: Both sides use sinusoidal positions (read by the :class:`Encoder` of the source).
    positional: ClassVar[str] = "sinusoidal"
    id_fields: ClassVar[tuple[str, ...]] = ("pad_id", "bos_id", "eos_id")
    presets: ClassVar[dict[str, dict[str, Any]]] = SEQ2SEQ_PRESETS
    preset_kind: ClassVar[str] = "seq2seq preset"

    def validate(self) -> None:
        for name in ("pad_id", "bos_id", "eos_id"):
            value = getattr(self, name)
            if not 0 <= value < self.tgt_vocab_size:
                raise ValueError(f"{name}={value} is outside tgt_vocab_size={self.tgt_vocab_size}")


class Seq2SeqTransformer(nn.Module):
    """Encoder-decoder Transformer with sinusoidal positions.

    The source goes through an :class:`Encoder`; the decoder's self-attention is causal (plus
    target padding) and its cross-attention sees every real source token. Logits for position
    ``t`` depend on ``tgt_in[:, :t+1]`` only, so with ``tgt_in`` = BOS + targets shifted right,
    the model never sees the token it predicts.

    Args:
        config: sizes and options.
        encoder_blocks: optional replacement encoder blocks, see :class:`Encoder`.
        decoder_blocks: optional replacement decoder blocks (e.g. a student's), each
            ``forward(x, memory, self_mask=None, memory_mask=None)``; default
            ``config.n_decoder_layers`` :class:`DecoderBlock`\\ s.
    """

    def __init__(
        self,
        config: Seq2SeqConfig,
        encoder_blocks: Sequence[nn.Module] | None = None,
        decoder_blocks: Sequence[nn.Module] | None = None,
    ) -> None:
        super().__init__()
        c = config
        self.config = c
        self.encoder = Encoder(c, encoder_blocks)  # the source side of the same config
        self.tgt_embed = _TokenEmbedding(c.tgt_vocab_size, c.d_model)
        self.tgt_positions = SinusoidalPositionalEncoding(c.d_model, c.max_len, dropout=c.dropout)
        if decoder_blocks is None:
            decoder_blocks = [
                DecoderBlock(c.d_model, c.n_heads, c.ff_dim, c.dropout, c.norm_first)
                for _ in range(c.n_decoder_layers)
            ]
        self.decoder_blocks = nn.ModuleList(decoder_blocks)
        # Pre-norm leaves the residual stream unnormalised: normalise once at the end.
        self.decoder_norm = LayerNorm(c.d_model) if c.norm_first else nn.Identity()
        self.output = nn.Linear(c.d_model, c.tgt_vocab_size)

    def encode(self, src: Tensor, src_padding_mask: Tensor | None = None) -> Tensor:
        """Encode the source: memory ``(B, S, D)`` (see :meth:`Encoder.forward`)."""
        return self.encoder(src, src_padding_mask)

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src_padding_mask: Tensor | None = None,
        tgt_padding_mask: Tensor | None = None,
    ) -> Tensor:
        """Decode all target positions in parallel (teacher forcing).

        Args:
            tgt_in: ``(B, T)`` decoder input ids (BOS first).
            memory: ``(B, S, D)`` from :meth:`encode`.
            src_padding_mask: ``(B, S)`` bool, True at real source tokens.
            tgt_padding_mask: ``(B, T)`` bool, True at real target tokens.

        Returns:
            Logits ``(B, T, V_tgt)``.
        """
        _check_tokens(tgt_in, self.config.max_len)
        _check_padding(tgt_padding_mask, tgt_in)
        T = tgt_in.shape[1]
        self_mask = combine_masks(tgt_padding_mask, causal_mask(T, device=tgt_in.device))
        memory_mask = (
            None if src_padding_mask is None else key_padding_to_attention(src_padding_mask)
        )
        x = self.tgt_positions(self.tgt_embed(tgt_in))  # (B, T, D)
        for block in self.decoder_blocks:
            x = block(x, memory, self_mask=self_mask, memory_mask=memory_mask)
        return self.output(self.decoder_norm(x))  # (B, T, V)

    def forward(
        self,
        src: Tensor,
        tgt_in: Tensor,
        src_padding_mask: Tensor | None = None,
        tgt_padding_mask: Tensor | None = None,
    ) -> Tensor:
        """Encode ``src`` and decode ``tgt_in``: logits ``(B, T, V_tgt)``."""
        memory = self.encode(src, src_padding_mask)
        return self.decode(tgt_in, memory, src_padding_mask, tgt_padding_mask)


# ----------------------------------------------------------------------------- GPT

#: Named GPT sizes. Character presets default to Tiny Shakespeare's 65 characters; pass
#: ``vocab_size=...`` to ``GPTConfig.from_name`` for another vocabulary.
GPT_PRESETS: dict[str, dict[str, Any]] = {
    "gpt-nano": dict(n_layers=3, n_heads=3, d_model=48, n_ctx=128, vocab_size=65),
    "gpt-micro": dict(n_layers=4, n_heads=4, d_model=128, n_ctx=256, vocab_size=65),
    "char-small": dict(n_layers=4, n_heads=4, d_model=128, n_ctx=64, vocab_size=65),
    # nanoGPT's shakespeare_char recipe (dropout 0.2 as there).
    "char-medium": dict(n_layers=6, n_heads=6, d_model=384, n_ctx=256, vocab_size=65, dropout=0.2),
    "gpt2": dict(n_layers=12, n_heads=12, d_model=768, n_ctx=1024, vocab_size=50257),
    # The lecture's GPT-3 (175B): build it on the meta device only.
    "gpt3": dict(n_layers=96, n_heads=96, d_model=12288, n_ctx=2048, vocab_size=50257),
}


@dataclass
class GPTConfig(ModelConfig):
    """Hyper-parameters of :class:`GPT` (``from_name`` presets: ``GPT_PRESETS``)."""

    vocab_size: int  # token ids (the output layer's size)
    n_ctx: int = 256  # context length: the position table's size
    d_model: int = 128  # residual stream width D
    n_layers: int = 4  # transformer blocks
    n_heads: int = 4  # attention heads; must divide d_model
    d_ff: int | None = None  # MLP width, default 4 * d_model
    dropout: float = 0.0  # embeddings, attention weights and residual branches
    bias: bool = True  # biases in linear layers and layer norms (GPT-2 has them)
    tie_weights: bool = True  # output layer shares the token embedding matrix
    activation: str = "gelu"  # MLP activation; GPT-2's checkpoints use "gelu_tanh"
    norm_eps: float = 1e-5  # added to the layer norms' variance (GPT-2: 1e-5)

    presets: ClassVar[dict[str, dict[str, Any]]] = GPT_PRESETS
    preset_kind: ClassVar[str] = "GPT preset"

    def validate(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation={self.activation!r} is not one of {sorted(ACTIVATIONS)}")
        if not self.norm_eps > 0:
            raise ValueError(f"norm_eps={self.norm_eps} must be positive")

    def param_count(self) -> int:
        """Number of parameters of ``GPT(self)`` (shared tied weights counted once).

        Counted on PyTorch's own layers of the same shapes, built on the meta device (no memory,
        and no graded answer: a student package whose lab 08 is open counts too).
        """
        with torch.device("meta"):
            D, bias = self.d_model, self.bias
            layers = [
                nn.Embedding(self.vocab_size, D),  # tokens
                nn.Embedding(self.n_ctx, D),  # positions
                nn.LayerNorm(D, bias=bias),  # final norm
                *(
                    nn.TransformerEncoderLayer(D, 1, self.ff_dim, bias=bias)  # attn, MLP, norms
                    for _ in range(self.n_layers)
                ),
            ]
            if not self.tie_weights:
                layers.append(nn.Linear(D, self.vocab_size, bias=False))  # output layer
            return sum(p.numel() for layer in layers for p in layer.parameters())


class CausalSelfAttention(MultiHeadAttention):
    """The GPT's attention: the kit's :class:`~transformer_lab.attention.MultiHeadAttention`
    with GPT-2's fused input projection.

    Self-attention projects one input three ways, so the three ``(D, D)`` input projections are
    stacked into one layer, ``qkv_proj`` (weight ``(3D, D)``, rows: query, key, value -- the
    layout of torch's ``in_proj_weight``): one matrix product instead of three. That is the only
    difference; heads, the KV cache, attention and ``out_proj`` are MultiHeadAttention's. It
    matters when every product is tiny, as in decoding one token at a time on a CPU, where the
    two extra calls per layer cost about a tenth of a step. Call it with the same tensor as
    query, key and value.

    Args:
        d_model: model width ``D``.
        n_heads: heads ``H``; must divide ``d_model``.
        bias: biases in both projections.
        dropout: dropout on the attention weights (training only).
    """

    def __init__(self, d_model: int, n_heads: int, bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__(d_model, n_heads, bias=bias, dropout=dropout)
        del self.q_proj, self.k_proj, self.v_proj  # replaced by one stacked layer
        self.qkv_proj = nn.Linear(d_model, 3 * d_model, bias=bias)

    def project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Heads of the fused projection: ``q, k, v`` of shape ``(B, H, T, Dh)`` each.

        Raises:
            ValueError: if ``key`` or ``value`` is not ``query`` (this is self-attention).
        """
        if key is not query or value is not query:
            raise ValueError("CausalSelfAttention is self-attention: pass x as query, key, value")
        q, k, v = self.qkv_proj(query).split(self.d_model, dim=-1)  # 3 x (B, T, D)
        return (
            split_heads(q, self.n_heads),  # (B, H, T, Dh)
            split_heads(k, self.n_heads),  # (B, H, T, Dh)
            split_heads(v, self.n_heads),  # (B, H, T, Dh)
        )


class GPTBlock(nn.Module):
    """Pre-norm decoder-only block (GPT-2): ``x + attn(ln1(x))`` then ``x + mlp(ln2(x))``.

    The attention is :class:`CausalSelfAttention` (the kit's multi-head attention with a fused
    input projection); dropout acts on its weights and on both residual branches.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        D, eps = config.d_model, config.norm_eps
        self.ln1 = LayerNorm(D, eps=eps, bias=config.bias, fused=True)
        self.attn = CausalSelfAttention(D, config.n_heads, bias=config.bias, dropout=config.dropout)
        self.ln2 = LayerNorm(D, eps=eps, bias=config.bias, fused=True)
        self.mlp = FeedForward(D, config.ff_dim, activation=config.activation, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self,
        x: Tensor,
        kv_cache: LayerKVCache | None = None,
        mask: Tensor | None = None,
        *,
        is_causal: bool = False,
    ) -> Tensor:
        """Apply the block.

        Args:
            x: ``(B, T, D)``.
            kv_cache: this layer's share of a KV cache (incremental decoding). Without one,
                attention is causal within ``x`` (the fused kernel's causal mode).
            mask: with a cache, which of the keys it returns each query may see, ``(T, S)``;
                None: all of them.
            is_causal: with a cache that returns exactly the new positions (a prompt from
                position 0), attend causally in the kernel's own mode instead of a mask.

        Returns:
            ``(B, T, D)``.
        """
        h = self.ln1(x)
        causal = kv_cache is None or is_causal
        a, _ = self.attn(h, h, h, mask, need_weights=False, is_causal=causal, kv_cache=kv_cache)
        x = x + self.dropout(a)
        return x + self.dropout(self.mlp(self.ln2(x)))


class GPT(nn.Module):
    """Decoder-only Transformer language model (GPT-2 layout).

    Token embeddings plus learned positions
    (:class:`~transformer_lab.positional.LearnedPositionalEncoding`), ``n_layers`` pre-norm
    :class:`GPTBlock`\\ s with causal attention, a final layer norm, and an output layer (tied to
    the token embedding by default). Weights start at ``N(0, 0.02)``; the projections writing
    into the residual stream at ``N(0, 0.02 / sqrt(2 n_layers))`` so the stream's variance does
    not grow with depth.

    Args:
        config: sizes and options.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        c = config
        self.config = c
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.positions = LearnedPositionalEncoding(c.d_model, c.n_ctx, dropout=c.dropout)
        self.blocks = nn.ModuleList(GPTBlock(c) for _ in range(c.n_layers))
        self.ln_f = LayerNorm(c.d_model, eps=c.norm_eps, bias=c.bias, fused=True)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_weights:
            self.lm_head.weight = self.tok_emb.weight
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT-2 initialisation (see the class docstring)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, 0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layers)
        for block in self.blocks:
            nn.init.normal_(block.attn.out_proj.weight, 0.0, residual_std)
            nn.init.normal_(block.mlp.linear2.weight, 0.0, residual_std)

    def new_kv_cache(
        self, batch_size: int, *, device: torch.device | str | None = None, dtype=None
    ) -> KVCache:
        """An empty :class:`KVCache` sized for this model (on its device and dtype by default)."""
        c = self.config
        w = self.tok_emb.weight
        return KVCache(
            c.n_layers,
            batch_size,
            c.n_heads,
            c.n_ctx,
            c.head_dim,
            dtype=dtype or w.dtype,
            device=device or w.device,
        )

    def forward(
        self, idx: Tensor, kv_cache: KVCache | None = None, *, offset: Tensor | None = None
    ) -> Tensor:
        """Next-token logits.

        Args:
            idx: ``(B, T)`` token ids. With a cache, only the positions not yet cached.
            kv_cache: optional cache: the new tokens' keys/values are stored in it and each
                query attends to the stored positions up to its own. Positions continue from
                ``kv_cache.length``, which advances by ``T``.
            offset: with a cache, the position of ``idx``'s first token as a one-element long
                tensor instead, for a caller that keeps positions on the device (a compiled
                decode step): ``kv_cache.length`` is then neither read nor advanced, and the
                range is not checked (that would copy the offset back to the CPU).

        Returns:
            Logits ``(B, T, V)``; position ``t`` depends on ``idx[:, :t+1]`` (and the cache) only.

        Raises:
            ValueError: if the positions would run past ``n_ctx``, or the batch size differs
                from the cache's.
        """
        if idx.ndim != 2:
            raise ValueError(f"idx must be (B, T), got shape {tuple(idx.shape)}")
        B, T = idx.shape
        n_ctx = self.config.n_ctx
        if kv_cache is None:
            if offset is not None:
                raise ValueError("offset is the position of idx in a KV cache: pass kv_cache too")
            if n_ctx < T:
                raise ValueError(f"sequence length T={T} exceeds n_ctx={n_ctx}")
            x = self.positions(self.tok_emb(idx))  # (B, T, D)
            for block in self.blocks:
                x = block(x)
            return self.lm_head(self.ln_f(x))  # (B, T, V)

        if kv_cache.batch_size != B:
            raise ValueError(f"batch size {B} != KV cache batch size {kv_cache.batch_size}")
        if offset is None:  # positions known here: attend to the stored prefix only
            start, end = kv_cache.length, kv_cache.length + T
            if end > n_ctx:
                raise ValueError(f"{start} cached + T={T} new positions exceed n_ctx={n_ctx}")
            positions = slice(start, end)
            # One new token, the newest position, sees every stored key: no mask needed. A
            # prompt from position 0 sees exactly its own keys, causally: the fused kernel's
            # causal mode does that without a mask (an explicit boolean mask runs SDPA's masked
            # kernel, 1.8-2.2x the time on a GPU: benchmarks/RESULTS.md, item 1).
            causal = start == 0 and T > 1
            mask = None if T == 1 or causal else kv_cache.visible[start:end, :end]  # (T, end)
            kv_cache.length = end
        else:  # positions on the device: all n_ctx slots, the same shapes at every step
            start = offset
            positions = offset + torch.arange(T, device=idx.device)  # (T,)
            mask = kv_cache.visible[positions]  # (T, n_ctx): position p sees slots 0..p
            causal = False
        x = self.positions(self.tok_emb(idx), start)  # (B, T, D)
        for i, block in enumerate(self.blocks):
            x = block(x, kv_cache.layer(i, positions), mask, is_causal=causal)
        return self.lm_head(self.ln_f(x))  # (B, T, V)
