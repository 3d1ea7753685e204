"""``transformer-lab generate``: decode from a checkpoint written by ``transformer-lab fit``.

The checkpoint carries everything needed: the module class and model config (to rebuild the
network) and the DataModule's tokenizer state (to turn the prompt into ids and back). What
"generate" means depends on the model:

* causal LM (GPT): continue the prompt, sampling with ``--temperature``, ``--top_k``,
  ``--top_p`` (``--temperature 0`` is greedy) or searching with ``--beam_width``;
* encoder-decoder: map the prompt (the source sequence) to a target sequence, greedily or with
  ``--beam_width``;
* encoder with a token head (copy, reverse, sort): one output token per input token.

Examples::

    transformer-lab generate --ckpt_path runs/reverse/version_0/checkpoints/last.ckpt \\
        --prompt 0123456789012345
    transformer-lab generate --ckpt_path runs/charlm_cpu/version_0/checkpoints/last.ckpt \\
        --prompt "ROMEO:" --max_new_tokens 200 --temperature 0.8 --top_k 40

Decoding itself is :mod:`transformer_lab.generation`; sampling follows Holtzman et al., "The
Curious Case of Neural Text Degeneration" (2020) for top-p.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from transformer_lab.graded import LockedAnswerError
from transformer_lab.training.checkpoints import (
    CHECKPOINT_KEY,
    CheckpointMismatchError,
    load_checkpoint_file,
    load_module,
)

__all__ = ["build_parser", "load_module", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``transformer-lab generate``."""
    parser = argparse.ArgumentParser(
        prog="transformer-lab generate",
        description="Decode from a checkpoint: continue a prompt (LM) or map a sequence "
        "(encoder-decoder, tagging encoder).",
    )
    parser.add_argument("--ckpt_path", required=True, help="a .ckpt written by transformer-lab fit")
    parser.add_argument("--prompt", required=True, help="text (or space-separated ids)")
    parser.add_argument("--max_new_tokens", type=int, default=100, help="LM: tokens to add")
    parser.add_argument(
        "--temperature", type=float, default=1.0, help="LM sampling temperature; 0 is greedy"
    )
    parser.add_argument("--top_k", type=int, default=None, help="LM: keep the k likeliest tokens")
    parser.add_argument("--top_p", type=float, default=None, help="LM: nucleus probability mass")
    parser.add_argument(
        "--beam_width", type=int, default=1, help="beam search when > 1 (LM and seq2seq)"
    )
    parser.add_argument(
        "--num_samples",
        type=int,
        default=1,
        help="LM: independent samples, each under a '--- sample i of n ---' line",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampling generator")
    parser.add_argument(
        "--device", default="auto", help="'auto' (CUDA if present), 'cpu', 'cuda', 'cuda:1', ..."
    )
    return parser


def _tokenizer(data: dict[str, Any], *names: str) -> Any:
    from transformer_lab.tokenizers import tokenizer_from_dict

    for name in names:
        entry = data.get(name)
        if isinstance(entry, dict) and "state" in entry:
            return tokenizer_from_dict(entry["state"])
    return None


def _encode(tokenizer: Any, text: str) -> list[int]:
    if tokenizer is None:
        try:
            return [int(word) for word in text.split()]
        except ValueError:
            raise ValueError(
                f"this checkpoint has no tokenizer: give the prompt as space-separated ids, "
                f"not {text!r}"
            ) from None
    return list(tokenizer.encode(text))


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    if tokenizer is None:
        return " ".join(str(int(i)) for i in ids)
    return tokenizer.decode(list(ids), skip_special=True)


def _cut_at(ids: list[int], eos_id: int | None) -> list[int]:
    return ids[: ids.index(eos_id)] if eos_id is not None and eos_id in ids else ids


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _generate_lm(module: Any, tokenizer: Any, data: dict[str, Any], args: Any) -> list[str]:
    from transformer_lab.generation import beam_search, generate

    model = module.model
    device = next(model.parameters()).device
    bos_id = data.get("bos_id") if tokenizer is None else tokenizer.bos_id
    eos_id = data.get("eos_id") if tokenizer is None else tokenizer.eos_id
    prompt = _encode(tokenizer, args.prompt)
    # Sentences and addition problems were trained from BOS; text windows were not.
    if data.get("starts_with_bos") and bos_id is not None and prompt[:1] != [bos_id]:
        prompt = [bos_id, *prompt]
    if not prompt:
        raise ValueError("the prompt is empty: an LM needs at least one token to continue")
    idx = torch.tensor([prompt], device=device)  # (1, T)
    if args.beam_width > 1:

        def step_fn(prefix: list[int]) -> Tensor:
            context = torch.tensor([prompt + prefix[1:]], device=device)[:, -model.config.n_ctx :]
            return torch.log_softmax(model(context)[0, -1].float(), dim=-1)  # (V,)

        best = beam_search(
            step_fn,
            bos_id=-1,
            eos_id=-1 if eos_id is None else eos_id,
            beam_width=args.beam_width,
            max_len=args.max_new_tokens + 1,
        )
        outputs = [prompt + best[1:]]
    else:
        generator = torch.Generator(device=device).manual_seed(args.seed)
        out = generate(
            model,
            idx.expand(args.num_samples, -1),
            args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            generator=generator,
        )  # (num_samples, T + max_new_tokens)
        outputs = out.tolist()
    texts = []
    for ids in outputs:
        new = _cut_at(ids[len(prompt) :], eos_id)
        texts.append(_decode(tokenizer, prompt + new))  # one call: word tokenizers add spaces
    return texts


def _generate_seq2seq(module: Any, src_tok: Any, tgt_tok: Any, args: Any) -> list[str]:
    from transformer_lab.generation import beam_search, greedy_decode

    model = module.model
    cfg = model.config
    device = next(model.parameters()).device
    src = torch.tensor([_encode(src_tok, args.prompt)], device=device)  # (1, S)
    if src.shape[1] == 0:
        raise ValueError("the prompt is empty: nothing to translate")
    if args.beam_width > 1:
        memory = model.encode(src)  # (1, S, D)

        def step_fn(prefix: list[int]) -> Tensor:
            tgt = torch.tensor([prefix], device=device)  # (1, L)
            return torch.log_softmax(model.decode(tgt, memory)[0, -1].float(), dim=-1)  # (V,)

        ids = beam_search(step_fn, cfg.bos_id, cfg.eos_id, args.beam_width, cfg.max_len)
    else:
        ids = greedy_decode(model, src, cfg.bos_id, cfg.eos_id, cfg.max_len)[0].tolist()
    ids = [i for i in _cut_at(ids[1:], cfg.eos_id) if i != cfg.pad_id]
    return [_decode(tgt_tok, ids)]


def _generate_tagging(module: Any, tokenizer: Any, args: Any) -> list[str]:
    model = module.model
    device = next(model.parameters()).device
    tokens = torch.tensor([_encode(tokenizer, args.prompt)], device=device)  # (1, T)
    if tokens.shape[1] == 0:
        raise ValueError("the prompt is empty: nothing to label")
    predictions = model(tokens).argmax(dim=-1)[0]  # (T,) token head | () sequence head
    if predictions.dim() == 0:
        return [f"class {int(predictions)}"]
    return [_decode(tokenizer, predictions.tolist())]


def main(args: list[str] | None = None) -> int:
    """Run ``transformer-lab generate`` with ``args``; return the exit status.

    Args:
        args: command-line words after ``generate``; ``None`` reads ``sys.argv``.

    Returns:
        0 on success, 2 for a bad checkpoint or argument (with a one-line message on stderr).
    """
    parser = build_parser()
    try:
        options = parser.parse_args(args)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 0
    try:
        if options.beam_width < 1:
            raise ValueError(f"--beam_width={options.beam_width} must be >= 1")
        if options.num_samples < 1:
            raise ValueError(f"--num_samples={options.num_samples} must be >= 1")
        checkpoint = load_checkpoint_file(options.ckpt_path)
        module = load_module(checkpoint).to(_device(options.device))
        data = checkpoint[CHECKPOINT_KEY].get("data") or {}
        kind = type(module).__name__
        with torch.no_grad():
            if kind == "CausalLMModule":
                texts = _generate_lm(module, _tokenizer(data, "tokenizer"), data, options)
            elif kind == "Seq2SeqModule":
                src_tok = _tokenizer(data, "src_tokenizer", "tokenizer")
                tgt_tok = _tokenizer(data, "tgt_tokenizer", "tokenizer")
                texts = _generate_seq2seq(module, src_tok, tgt_tok, options)
            else:
                texts = _generate_tagging(module, _tokenizer(data, "tokenizer"), options)
    except (CheckpointMismatchError, ValueError, KeyError) as error:
        print(f"transformer-lab generate: error: {error}", file=sys.stderr)
        return 2
    except LockedAnswerError as error:
        # A student package before the deadline of the lab that grades decoding.
        print(f"transformer-lab generate: not available yet: {error}", file=sys.stderr)
        return 2
    for number, text in enumerate(texts, start=1):
        if len(texts) > 1:  # samples are often several lines each: say where each one starts
            print(f"--- sample {number} of {len(texts)} ---")
        print(text)
    return 0
