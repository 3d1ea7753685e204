"""Back-of-the-envelope arithmetic of large language models: parameters, training compute and the
memory of a KV cache.

A GPT's size is dominated by ``12 * n_layers * d_model**2`` (attention ``4 D^2`` plus an MLP of
``8 D^2`` per block); training costs about ``6 N D`` floating-point operations for ``N`` parameters
and ``D`` tokens (2 for the forward multiply-add, 4 for the backward pass); generation keeps a key
and a value vector per layer and position. These functions make the lecture's numbers checkable:
GPT-2 small has 124,439,808 parameters, and the lecture's GPT-3 gives about 175 billion.

References: Radford et al., 2019 (GPT-2); Brown et al., "Language Models are Few-Shot Learners",
2020 (GPT-3, table 2.1); Kaplan et al., "Scaling Laws for Neural Language Models", 2020
(the ``6 N D`` rule).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "GPT3",
    "ModelSpec",
    "gpt_param_count",
    "kv_cache_bytes",
    "training_flops",
]


def _check(**values: int) -> None:
    bad = {k: v for k, v in values.items() if v < 1}
    if bad:
        raise ValueError(", ".join(f"{k}={v}" for k, v in bad.items()) + ": must be >= 1")


def gpt_param_count(
    n_layers: int,
    d_model: int,
    vocab_size: int,
    n_ctx: int,
    bias: bool = True,
    tie_weights: bool = True,
    d_ff: int | None = None,
) -> int:
    """Parameters of a GPT-2-style model (the layout of :class:`transformer_lab.models.GPT`).

    Counted: token and learned position embeddings; per block two layer norms, the fused
    query/key/value projection, the output projection and the two MLP layers; a final layer norm;
    an output layer unless tied to the token embedding. ``bias=False`` drops the biases of the
    linear layers *and* of the layer norms.

    Args:
        n_layers: blocks ``L``.
        d_model: width ``D``.
        vocab_size: vocabulary ``V``.
        n_ctx: context length (rows of the position table).
        bias: biases in linear layers and layer norms.
        tie_weights: output layer shares the token embedding.
        d_ff: MLP width (default ``4 D``).

    Returns:
        The exact count, e.g. 124,439,808 for GPT-2 small ``(12, 768, 50257, 1024)``.
    """
    _check(n_layers=n_layers, d_model=d_model, vocab_size=vocab_size, n_ctx=n_ctx)
    D = d_model
    F = 4 * D if d_ff is None else d_ff
    _check(d_ff=F)
    b = 1 if bias else 0
    layer_norm = D + b * D
    attention = D * 3 * D + b * 3 * D + D * D + b * D
    mlp = D * F + b * F + F * D + b * D
    per_block = 2 * layer_norm + attention + mlp
    embeddings = vocab_size * D + n_ctx * D
    head = 0 if tie_weights else vocab_size * D
    return embeddings + n_layers * per_block + layer_norm + head


def training_flops(n_params: float, n_tokens: float) -> float:
    """Approximate training compute, ``6 * N * D`` floating-point operations.

    Args:
        n_params: parameters ``N``.
        n_tokens: training tokens ``D``.

    Returns:
        FLOPs (a float: the numbers overflow nothing but read better in scientific notation).
    """
    if n_params <= 0 or n_tokens <= 0:
        raise ValueError(f"n_params={n_params} and n_tokens={n_tokens} must be positive")
    return 6.0 * float(n_params) * float(n_tokens)


def kv_cache_bytes(
    n_layers: int,
    d_model: int,
    n_ctx: int,
    batch_size: int = 1,
    bytes_per_value: int = 2,
) -> int:
    """Memory of a full KV cache: a key and a value of width ``D`` per layer, position, sequence.

    ``2 * n_layers * n_ctx * d_model * batch_size * bytes_per_value`` (2 bytes: float16/bfloat16).

    Args:
        n_layers: blocks ``L``.
        d_model: width ``D`` (all heads together).
        n_ctx: cached positions.
        batch_size: sequences decoded together.
        bytes_per_value: bytes per stored number.

    Returns:
        Bytes.
    """
    _check(
        n_layers=n_layers,
        d_model=d_model,
        n_ctx=n_ctx,
        batch_size=batch_size,
        bytes_per_value=bytes_per_value,
    )
    return 2 * n_layers * n_ctx * d_model * batch_size * bytes_per_value


@dataclass(frozen=True)
class ModelSpec:
    """The published shape of a model, as the lecture quotes it."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_ctx: int
    vocab_size: int
    n_params: float  # as published
    n_tokens: float  # training tokens, as published

    def param_count(self) -> int:
        """Parameters recomputed from the shape with :func:`gpt_param_count`."""
        return gpt_param_count(self.n_layers, self.d_model, self.vocab_size, self.n_ctx)

    def training_flops(self) -> float:
        """``6 N D`` with the published ``N`` and ``D``."""
        return training_flops(self.n_params, self.n_tokens)


#: GPT-3 175B (Brown et al. 2020, table 2.1): recomputing its parameters gives about 175B
#: (174.6B: the paper rounds), and 6ND about 3.15e23 FLOPs.
GPT3 = ModelSpec(
    name="gpt3",
    n_layers=96,
    d_model=12288,
    n_heads=96,
    n_ctx=2048,
    vocab_size=50257,
    n_params=175e9,
    n_tokens=300e9,
)
