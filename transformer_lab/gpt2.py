"""GPT-2's pretrained weights in the kit's :class:`~transformer_lab.models.GPT`, run by any
causal self-attention: the kit's, or the one a student wrote in lab 08.

GPT-2 is the kit's GPT layout exactly: learned positions, pre-norm blocks, GELU with the tanh
approximation, layer norms with ``eps = 1e-5``, a final layer norm and an output layer tied to
the token embedding. Only the storage differs: GPT-2's ``Conv1D`` layers keep their weight as
``(in, out)``, the transpose of ``nn.Linear``'s ``(out, in)``, so :func:`load_gpt2_weights`
transposes them. Nothing else is converted: the fused ``c_attn`` projection is already laid out
as the kit's ``qkv_proj`` (queries, keys, values).

* :func:`from_pretrained` downloads a checkpoint (``config.json``, ``model.safetensors``,
  ``tokenizer.json``) with ``huggingface_hub`` -- cached, resumable, from ``$HF_ENDPOINT`` if
  set -- or reads them from a local folder, builds the GPT with the given attention class, loads
  the weights and returns it with GPT-2's byte-level BPE tokenizer (:class:`GPT2Tokenizer`, read
  with ``tokenizers``). Without a connection (and no cached copy) it raises
  :class:`GPT2UnavailableError`, whose message is one line a notebook can print before going on.
* :func:`build_gpt` puts an attention class into every block. A student's class,
  ``CausalSelfAttention(d_model, n_heads, dropout=0.0)`` with ``forward(x, kv_cache=None)`` and
  the layers ``qkv_proj`` and ``out_proj``, is subclassed so the blocks can call it the way they
  call the kit's multi-head attention (:func:`kit_callable`).
* :func:`attention_maps` gives every head's attention weights, computed from each layer's own
  ``qkv_proj`` on the input that layer received (for ``plots.plot_attention_maps``).

It needs three more packages (:data:`PACKAGES`, the ``gpt2`` extra of the instructor's
install); a student package declares no extras, so a missing one is named with its pip line.

References: Radford et al., "Language Models are Unsupervised Multitask Learners", 2019; the
GPT-2 checkpoints at https://huggingface.co/openai-community/gpt2; A. Karpathy, nanoGPT's
``GPT.from_pretrained`` (the same transposition).
"""

from __future__ import annotations

import functools
import json
import os
import socket
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from transformer_lab.attention import MultiHeadAttention, split_heads
from transformer_lab.models import GPT, GPTConfig

__all__ = [
    "GPT2_FILES",
    "GPT2_REPOS",
    "GPT2Tokenizer",
    "GPT2UnavailableError",
    "attention_maps",
    "build_gpt",
    "config_from_hf",
    "download_gpt2",
    "from_pretrained",
    "inference_dtype",
    "kit_callable",
    "load_gpt2_weights",
]

#: Hub repositories of the four GPT-2 sizes (124M, 355M, 774M, 1.5B parameters).
GPT2_REPOS: dict[str, str] = {
    "gpt2": "openai-community/gpt2",
    "gpt2-medium": "openai-community/gpt2-medium",
    "gpt2-large": "openai-community/gpt2-large",
    "gpt2-xl": "openai-community/gpt2-xl",
}
#: What a checkpoint folder holds: the shape, the weights, the tokenizer.
GPT2_FILES = ("config.json", "model.safetensors", "tokenizer.json")
#: The packages GPT-2 needs (the ``gpt2`` extra in ``pyproject.toml``; a test keeps them equal).
PACKAGES = ("huggingface_hub>=0.20", "safetensors>=0.4", "tokenizers>=0.15")
_EXTRA = (
    "huggingface_hub, safetensors and tokenizers: install them in the notebook with "
    f"%pip install {' '.join(repr(p) for p in PACKAGES)}, then re-run the setup cell"
)
_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}


class GPT2UnavailableError(RuntimeError):
    """The checkpoint cannot be had here (no connection, no cached copy, or no extras).

    Its message is one line, meant to be printed as it is.
    """


# ----------------------------------------------------------------------------- files


def _endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or "https://huggingface.co"


def download_gpt2(
    name: str = "gpt2",
    *,
    endpoint: str | None = None,
    cache_dir: str | Path | None = None,
    timeout: float = 10.0,
) -> dict[str, Path]:
    """The checkpoint files of ``name``, downloaded once into the Hugging Face cache.

    Args:
        name: a size of :data:`GPT2_REPOS`, or a hub repository id (``"owner/name"``).
        endpoint: the hub's address; default ``$HF_ENDPOINT`` (read at each call), else
            ``https://huggingface.co``.
        cache_dir: the download cache; default ``$HF_HUB_CACHE`` (read at each call), else
            ``huggingface_hub``'s own (``~/.cache/huggingface/hub``).
        timeout: seconds to wait for the hub to answer.

    Returns:
        ``{file name: local path}`` for each of :data:`GPT2_FILES`.

    Raises:
        GPT2UnavailableError: ``huggingface_hub`` is missing, or the hub cannot be reached and the
            cache holds no copy, or the repository lacks one of the files.
    """
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.utils import HfHubHTTPError, LocalEntryNotFoundError  # 0.20 on
    except ImportError:
        raise GPT2UnavailableError(f"GPT-2 needs {_EXTRA}") from None
    repo = GPT2_REPOS.get(name, name)
    url = endpoint or _endpoint()
    cache = cache_dir or os.environ.get("HF_HUB_CACHE") or None

    def fetch(filename: str, offline: bool) -> Path:
        return Path(
            hf_hub_download(
                repo,
                filename,
                endpoint=url,
                cache_dir=cache,
                etag_timeout=timeout,
                local_files_only=offline,
            )
        )

    try:  # a copy in the cache is used as it is: no network at all
        return {filename: fetch(filename, offline=True) for filename in GPT2_FILES}
    except LocalEntryNotFoundError:
        pass
    if not _reachable(url, timeout):  # the hub's client would retry for half a minute
        raise GPT2UnavailableError(
            f"GPT-2 ({repo}) is not available: {url} cannot be reached (offline?) and the "
            "cache holds no copy, so this section is skipped."
        )
    paths = {}
    for filename in GPT2_FILES:
        try:
            paths[filename] = fetch(filename, offline=False)
        except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise GPT2UnavailableError(
                f"GPT-2 ({repo}): {filename} could not be downloaded from {url} ({reason})."
            ) from None
    return paths


def _reachable(url: str, timeout: float) -> bool:
    """Whether a TCP connection to ``url``'s host opens within ``timeout`` seconds."""
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "", port), timeout=timeout):
            return True
    except OSError:
        return False


def _local_files(folder: Path) -> dict[str, Path]:
    missing = [f for f in GPT2_FILES if not (folder / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder} is not a GPT-2 checkpoint folder: it lacks {missing}")
    return {f: folder / f for f in GPT2_FILES}


# ----------------------------------------------------------------------------- tokenizer


class GPT2Tokenizer:
    """GPT-2's byte-level BPE, read from a ``tokenizer.json`` with the ``tokenizers`` library.

    Byte-level: the text's UTF-8 bytes are the 256 starting symbols, so no text is ever
    unknown; 50,000 merges build the rest of GPT-2's 50,257 tokens, ``<|endoftext|>`` last.

    Args:
        path: a ``tokenizer.json`` (as ``tokenizers`` and ``transformers`` save them).

    Raises:
        GPT2UnavailableError: the ``tokenizers`` library is missing.
        ValueError: the file is not a tokenizer ``tokenizers`` can read.
    """

    EOS = "<|endoftext|>"

    def __init__(self, path: str | Path) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise GPT2UnavailableError(f"the GPT-2 tokenizer needs {_EXTRA}") from None
        try:
            self.backend = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises its own Exception subclass
            raise ValueError(f"{path} is not a tokenizer file: {exc}") from None
        self.eos_id: int | None = self.backend.token_to_id(self.EOS)

    @property
    def vocab_size(self) -> int:
        """Number of token ids, special tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int] | Tensor) -> str:
        """The text of ``ids``: ``decode(encode(text)) == text`` for every text."""
        ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        return self.backend.decode(ids, skip_special_tokens=False)

    def token_index(self, text: str, char_index: int) -> int:
        """Which token of ``encode(text)`` holds the character ``text[char_index]``.

        Raises:
            ValueError: ``char_index`` is outside ``text``.
        """
        if not 0 <= char_index < len(text):
            raise ValueError(
                f"char_index={char_index} is outside the text ({len(text)} characters)"
            )
        offsets = self.backend.encode(text, add_special_tokens=False).offsets
        return next(i for i, (start, end) in enumerate(offsets) if start <= char_index < end)

    def tokenize(self, text: str) -> list[str]:
        """The pieces of ``text`` as readable strings (a space shown as part of its word)."""
        return [self.decode([i]) for i in self.encode(text)]


# ----------------------------------------------------------------------------- the model


def config_from_hf(hf: Mapping[str, Any]) -> GPTConfig:
    """The kit's :class:`GPTConfig` for a GPT-2 ``config.json`` (a ``GPT2Config``'s dict).

    Raises:
        ValueError: for a field GPT-2's layout does not have (an unknown activation, a separate
            output layer, scaled or reordered attention).
    """
    activation = hf.get("activation_function", "gelu_new")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation_function={activation!r} is not one of {sorted(_ACTIVATIONS)}")
    unsupported = {
        "tie_word_embeddings": (hf.get("tie_word_embeddings", True), True),
        "scale_attn_weights": (hf.get("scale_attn_weights", True), True),
        "scale_attn_by_inverse_layer_idx": (
            hf.get("scale_attn_by_inverse_layer_idx", False),
            False,
        ),
        "reorder_and_upcast_attn": (hf.get("reorder_and_upcast_attn", False), False),
    }
    for key, (value, wanted) in unsupported.items():
        if value != wanted:
            raise ValueError(f"{key}={value!r}: the kit's GPT supports only {key}={wanted!r}")
    d_model = hf["n_embd"]
    return GPTConfig(
        vocab_size=hf["vocab_size"],
        n_ctx=hf["n_positions"],
        d_model=d_model,
        n_layers=hf["n_layer"],
        n_heads=hf["n_head"],
        d_ff=hf.get("n_inner") or 4 * d_model,
        dropout=0.0,  # inference: GPT-2's dropouts (0.1) matter only for fine-tuning
        activation=_ACTIVATIONS[activation],
        norm_eps=hf.get("layer_norm_epsilon", 1e-5),
    )


@functools.cache
def kit_callable(attention: type[nn.Module]) -> type[nn.Module]:
    """A subclass of ``attention`` that the kit's GPT blocks can call.

    The blocks call ``attn(h, h, h, mask, need_weights=..., is_causal=..., kv_cache=...)`` and
    expect ``(out, weights)``; a lab-08 ``CausalSelfAttention`` takes ``forward(x,
    kv_cache=None)`` and returns ``out``, building its own causal ``(T, S)`` mask. The subclass
    passes ``h`` and the cache on; its parameters keep their names (``qkv_proj``,
    ``out_proj``). One subclass per class.
    """

    def forward(
        self: nn.Module,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        mask: Tensor | None = None,
        need_weights: bool = False,
        *,
        is_causal: bool = False,
        kv_cache: Any = None,
    ) -> tuple[Tensor, None]:
        return attention.forward(self, query, kv_cache), None  # the block's mask is unused

    return type(
        attention.__name__,
        (attention,),
        {"forward": forward, "__module__": attention.__module__, "__doc__": attention.__doc__},
    )


def build_gpt(
    config: GPTConfig, attention: type[nn.Module] | None = None, *, init: bool = True
) -> GPT:
    """The kit's GPT with ``attention(d_model, n_heads, dropout=...)`` in every block.

    Args:
        config: the GPT's sizes and options.
        attention: a class like lab 08's ``CausalSelfAttention``; ``None`` (or a subclass of
            the kit's ``MultiHeadAttention``, which the blocks call directly) keeps the kit's.
        init: GPT-2-initialise the new attention layers with the rest; ``False`` when every
            weight is about to be loaded (it saves a second pass over 124M random numbers).

    Returns:
        The GPT.

    Raises:
        TypeError: the attention lacks ``qkv_proj``/``out_proj`` layers of the right shapes.
    """
    model = GPT(config)
    if attention is None:
        return model
    c = config
    for block in model.blocks:
        if isinstance(block.attn, attention):
            continue
        if issubclass(attention, MultiHeadAttention):
            block.attn = attention(c.d_model, c.n_heads, dropout=c.dropout)
        else:
            block.attn = kit_callable(attention)(c.d_model, c.n_heads, dropout=c.dropout)
        _check_projections(block.attn, c.d_model)
    if init:
        model.reset_parameters()
    return model


def _check_projections(attn: nn.Module, d_model: int) -> None:
    for name, shape in (("qkv_proj", (3 * d_model, d_model)), ("out_proj", (d_model, d_model))):
        layer = getattr(attn, name, None)
        if not isinstance(layer, nn.Linear) or tuple(layer.weight.shape) != shape:
            raise TypeError(
                f"{type(attn).__name__}.{name} must be an nn.Linear with a weight of shape "
                f"{shape} (and a bias) to take GPT-2's weights; it is {layer!r}"
            )
        if layer.bias is None:
            raise TypeError(f"{type(attn).__name__}.{name} needs a bias: GPT-2's has one")


def _hf_names(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Drop ``GPT2LMHeadModel``'s ``transformer.`` prefix and its masks and tied head."""
    out = {}
    for name, tensor in state.items():
        name = name.removeprefix("transformer.")
        if name.endswith((".attn.bias", ".attn.masked_bias")) or name == "lm_head.weight":
            continue  # causal-mask buffers of old checkpoints; the head is the embedding
        out[name] = tensor
    return out


@torch.no_grad()
def load_gpt2_weights(model: GPT, state: Mapping[str, Tensor]) -> None:
    """Copy a GPT-2 state dict (hub or ``GPT2LMHeadModel`` names) into ``model``.

    ``Conv1D`` weights ``(in, out)`` are transposed into ``nn.Linear``'s ``(out, in)``.

    Raises:
        ValueError: a tensor is missing, left over, or of the wrong shape (named).
    """
    theirs = _hf_names(state)
    ours: list[tuple[str, Tensor, bool]] = [  # (GPT-2 name, our tensor, transpose?)
        ("wte.weight", model.tok_emb.weight, False),
        ("wpe.weight", model.positions.embedding.weight, False),
        ("ln_f.weight", model.ln_f.weight, False),
        ("ln_f.bias", model.ln_f.bias, False),
    ]
    for i, block in enumerate(model.blocks):
        layers = {
            "ln_1": block.ln1,
            "attn.c_attn": block.attn.qkv_proj,
            "attn.c_proj": block.attn.out_proj,
            "ln_2": block.ln2,
            "mlp.c_fc": block.mlp.linear1,
            "mlp.c_proj": block.mlp.linear2,
        }
        for name, layer in layers.items():
            conv = isinstance(layer, nn.Linear)
            ours.append((f"h.{i}.{name}.weight", layer.weight, conv))
            ours.append((f"h.{i}.{name}.bias", layer.bias, False))
    missing = sorted({name for name, _, _ in ours} - set(theirs))
    extra = sorted(set(theirs) - {name for name, _, _ in ours})
    if missing or extra:
        raise ValueError(
            f"the checkpoint does not fit a {model.config.n_layers}-layer GPT: "
            f"missing {missing[:4]}, unexpected {extra[:4]}"
        )
    for name, tensor, transpose in ours:
        source = theirs[name].t() if transpose else theirs[name]
        if source.shape != tensor.shape:
            raise ValueError(
                f"{name}: the checkpoint's tensor has shape {tuple(theirs[name].shape)}, "
                f"the model expects {tuple(tensor.shape)}" + (" (transposed)" if transpose else "")
            )
        tensor.copy_(source)


def inference_dtype(precision: str) -> torch.dtype:
    """The dtype to run a model in under a Lightning precision (``session.precision``).

    ``"bf16-mixed"`` -> bfloat16, ``"16-mixed"`` (a T4) -> float16, else float32: the choice
    :func:`transformer_lab.training.devices.choose_precision` makes for training.
    """
    return {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision, torch.float32)


def from_pretrained(
    name: str | Path = "gpt2",
    attention: type[nn.Module] | None = None,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    endpoint: str | None = None,
    cache_dir: str | Path | None = None,
) -> tuple[GPT, GPT2Tokenizer]:
    """A pretrained GPT-2 in the kit's GPT with ``attention`` in every block, and its tokenizer.

    Args:
        name: a size of :data:`GPT2_REPOS` (``"gpt2"``: 124M parameters, 0.5 GB in float32;
            ``"gpt2-medium"``: 355M), a hub repository id, or a local folder holding
            :data:`GPT2_FILES`.
        attention: see :func:`build_gpt` (default the kit's).
        device: where the model goes.
        dtype: its dtype (see :func:`inference_dtype`).
        endpoint: the hub's address (default ``$HF_ENDPOINT``).
        cache_dir: the download cache (default ``$HF_HUB_CACHE``).

    Returns:
        ``(model, tokenizer)``, the model in eval mode.

    Raises:
        GPT2UnavailableError: offline without a cached copy, or the extras are missing.
    """
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise GPT2UnavailableError(f"GPT-2 needs {_EXTRA}") from None
    folder = Path(name)
    if folder.is_dir():
        files = _local_files(folder)
    else:
        files = download_gpt2(str(name), endpoint=endpoint, cache_dir=cache_dir)
    config = config_from_hf(json.loads(files["config.json"].read_text()))
    model = build_gpt(config, attention, init=False)
    load_gpt2_weights(model, load_file(str(files["model.safetensors"])))
    return model.to(device=device, dtype=dtype).eval(), GPT2Tokenizer(files["tokenizer.json"])


# ----------------------------------------------------------------------------- attention maps


@torch.no_grad()
def attention_maps(model: GPT, idx: Tensor) -> list[Tensor]:
    """Every layer's attention weights on ``idx``: one ``(B, H, T, T)`` tensor per layer.

    Each layer's input is recorded as the model runs; the weights are then computed from that
    layer's own ``qkv_proj`` (queries and keys, split into heads), ``softmax(q k^T / sqrt(Dh))``
    under the causal mask: what the layer's attention averages its values with, for any
    attention class with a fused ``qkv_proj``.
    """
    seen: list[Tensor] = []  # each layer's input h = ln1(x), (B, T, D)
    hooks = [
        block.attn.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
        for block in model.blocks
    ]
    try:
        model(idx)
    finally:
        for hook in hooks:
            hook.remove()
    maps = []
    for block, x in zip(model.blocks, seen, strict=True):
        D, H = model.config.d_model, model.config.n_heads
        q, k, _ = block.attn.qkv_proj(x).float().split(D, dim=-1)  # 3 x (B, T, D)
        q, k = split_heads(q, H), split_heads(k, H)  # (B, H, T, Dh)
        scores = q @ k.transpose(-2, -1) / (D // H) ** 0.5  # (B, H, T, T)
        T = x.shape[1]
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)  # (T, T)
        maps.append(scores.masked_fill(future, float("-inf")).softmax(dim=-1))
    return maps
