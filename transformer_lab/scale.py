"""Back-of-the-envelope arithmetic of large language models: parameters, training compute, the
memory of a KV cache and the time a training run takes on one GPU.

A GPT's size is dominated by ``12 * n_layers * d_model**2`` (attention ``4 D^2`` plus an MLP of
``8 D^2`` per block); training costs about ``6 N D`` floating-point operations for ``N`` parameters
and ``D`` tokens (2 for the forward multiply-add, 4 for the backward pass); generation keeps a key
and a value vector per layer and position. These functions make the lecture's numbers checkable:
GPT-2 small has 124,439,808 parameters, the lecture's GPT-3 about 175 billion, whose 300 billion
training tokens cost about 3.1e23 FLOPs: some 29,000 days of one A100 at 40% of its peak.

Lab 08 asks students for :func:`gpt_param_count`, :func:`training_flops`, :func:`kv_cache_bytes`
and :func:`gpu_days` (the kit's versions are its answers); :data:`GPT2_FAMILY`,
:data:`GPT3_FAMILY` and :data:`PEAK_FLOPS` hold the published numbers the lab uses.

References: Radford et al., "Language Models are Unsupervised Multitask Learners", 2019 (GPT-2,
table 2); Brown et al., "Language Models are Few-Shot Learners", 2020 (GPT-3, table 2.1 and
appendix D); Kaplan et al., "Scaling Laws for Neural Language Models", 2020 (the ``6 N D`` rule);
NVIDIA's A100 and H100 datasheets (dense bfloat16 peaks).
"""

from __future__ import annotations

from dataclasses import dataclass

from transformer_lab.graded import graded

__all__ = [
    "GPT2_FAMILY",
    "GPT3",
    "GPT3_FAMILY",
    "PEAK_FLOPS",
    "SECONDS_PER_DAY",
    "ModelSpec",
    "gpt_param_count",
    "gpu_days",
    "kv_cache_bytes",
    "training_flops",
]

SECONDS_PER_DAY = 86_400

#: Dense (no sparsity) peak throughput in FLOP/s of the formats large models train in:
#: V100 fp16 on tensor cores (GPT-3's own hardware), A100 and H100/H200 SXM in bfloat16.
PEAK_FLOPS: dict[str, float] = {
    "V100 (fp16)": 125e12,
    "A100 (bf16)": 312e12,
    "H100 (bf16)": 989e12,
}


def _check(**values: int) -> None:
    bad = {k: v for k, v in values.items() if v < 1}
    if bad:
        raise ValueError(", ".join(f"{k}={v}" for k, v in bad.items()) + ": must be >= 1")


@graded("08_language_models")
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


@graded("08_language_models")
def training_flops(n_params: float, n_tokens: float) -> float:
    """Approximate training compute, ``6 * N * D`` floating-point operations.

    Each parameter does one multiply-add (2 FLOPs) per token in the forward pass and two in the
    backward pass (gradients with respect to its input and to itself): 6 per parameter per token.

    Args:
        n_params: parameters ``N``.
        n_tokens: training tokens ``D``.

    Returns:
        FLOPs (a float: the numbers overflow nothing but read better in scientific notation).
    """
    if n_params <= 0 or n_tokens <= 0:
        raise ValueError(f"n_params={n_params} and n_tokens={n_tokens} must be positive")
    return 6.0 * float(n_params) * float(n_tokens)


@graded("08_language_models")
def kv_cache_bytes(
    n_layers: int,
    d_model: int,
    n_ctx: int,
    batch_size: int = 1,
    bytes_per_value: int = 2,
) -> int:
    """Memory of a full KV cache: a key and a value of width ``D`` per layer, position, sequence.

    ``2 * n_layers * n_ctx * d_model * batch_size * bytes_per_value`` (2 bytes: float16/bfloat16).
    ``d_model`` is every head's keys together, ``n_heads * head_dim``.

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


@graded("08_language_models")
def gpu_days(flops: float, peak_flops: float, utilization: float) -> float:
    """Days one GPU needs for ``flops`` operations at a share ``utilization`` of its peak.

    ``flops / (peak_flops * utilization)`` seconds, divided by 86,400. Large training runs
    reach 30-50% of the peak ("model FLOPs utilisation"); the rest goes to memory traffic,
    communication between GPUs and idle time.

    Args:
        flops: the work, e.g. :func:`training_flops`.
        peak_flops: the GPU's peak in FLOP/s (:data:`PEAK_FLOPS`).
        utilization: achieved share of the peak, in ``(0, 1]``.

    Returns:
        GPU-days (divide by the number of GPUs for the wall-clock days of a run).

    Raises:
        ValueError: if ``flops`` or ``peak_flops`` is not positive or ``utilization`` lies
            outside ``(0, 1]``.
    """
    if flops <= 0 or peak_flops <= 0:
        raise ValueError(f"flops={flops} and peak_flops={peak_flops} must be positive")
    if not 0.0 < utilization <= 1.0:
        raise ValueError(f"utilization={utilization} must lie in (0, 1] (0.4 means 40%)")
    return float(flops) / (float(peak_flops) * float(utilization)) / SECONDS_PER_DAY


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
    n_tokens: float | None  # training tokens, as published (None: not published)

    def param_count(self) -> int:
        """Parameters recomputed from the shape with :func:`gpt_param_count`."""
        return gpt_param_count(self.n_layers, self.d_model, self.vocab_size, self.n_ctx)

    def training_flops(self) -> float:
        """``6 N D`` with the published ``N`` and ``D``.

        Raises:
            ValueError: if the number of training tokens was not published.
        """
        if self.n_tokens is None:
            raise ValueError(f"{self.name}: the number of training tokens was not published")
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

#: The four GPT-2 models (Radford et al. 2019, table 2; the paper's 117M, 345M, 762M and 1542M
#: are the released models' 124M, 355M, 774M and 1.56B once the embeddings are counted
#: exactly). Context 1024, vocabulary 50,257; their training tokens were not published.
GPT2_FAMILY: tuple[ModelSpec, ...] = tuple(
    ModelSpec(name, layers, width, heads, 1024, 50257, params, None)
    for name, layers, width, heads, params in (
        ("GPT-2 small", 12, 768, 12, 124e6),
        ("GPT-2 medium", 24, 1024, 16, 355e6),
        ("GPT-2 large", 36, 1280, 20, 774e6),
        ("GPT-2 XL", 48, 1600, 25, 1.558e9),
    )
)

#: The eight GPT-3 models (Brown et al. 2020, table 2.1), all trained on 300B tokens with a
#: context of 2048. The paper's 13B has d_model 5140 (with 40 heads of 128, as printed).
GPT3_FAMILY: tuple[ModelSpec, ...] = tuple(
    ModelSpec(name, layers, width, heads, 2048, 50257, params, 300e9)
    for name, layers, width, heads, params in (
        ("GPT-3 Small", 12, 768, 12, 125e6),
        ("GPT-3 Medium", 24, 1024, 16, 350e6),
        ("GPT-3 Large", 24, 1536, 16, 760e6),
        ("GPT-3 XL", 24, 2048, 24, 1.3e9),
        ("GPT-3 2.7B", 32, 2560, 32, 2.7e9),
        ("GPT-3 6.7B", 32, 4096, 32, 6.7e9),
        ("GPT-3 13B", 40, 5140, 40, 13.0e9),
        ("GPT-3 175B", 96, 12288, 96, 175.0e9),
    )
)
