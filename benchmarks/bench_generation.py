"""Item 5: generation speed of the kit's GPT without a KV cache, with it, and compiled.

Without a cache every new token re-runs the model over the whole prefix (cost ~ T^2 per
sequence); with the cache each step feeds only the newest token and attends to the stored
keys and values (cost ~ T). For a small model a step is then a few hundred tiny kernels, so its
time is launch and Python overhead: the third candidate, ``compiled``, runs the kit's static
decode step (``compile_decode_step``: a preallocated cache, the same shapes at every step, one
step per batch size reused by every ``generate`` call) through ``torch.compile`` -- on CUDA with
``mode="reduce-overhead"``, one CUDA-graph replay per token.

The script times ``transformer_lab.generation.generate`` each way, alternating repetitions, at
batch 1 and batch 8, and reports new tokens per second (batch times new tokens over wall time)
and the speed-ups over no cache. Before timing it checks that greedy decoding gives the same
tokens every way. Compilation (once per batch size: seconds on a GPU, about 25 s with inductor
on a 2-core CPU) happens before timing; the first compiled call's time, compilation included,
is reported as ``compiled_first_s`` (what a student waits for once, before the speed-up pays).
``--compile auto`` compiles on CUDA only; ``--smoke`` compiles with the ``eager`` backend (the
static path and its capture, in seconds).

Reference: Pope et al. 2022, "Efficiently Scaling Transformer Inference" (KV caching).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from _common import (
    alternate,
    base_parser,
    kit_available,
    machine,
    now,
    print_table,
    setup,
    write_json,
)

# The table's columns (report.py renders RESULTS.md with the same ones).
COLUMNS = [
    "batch",
    "prompt",
    "new_tokens",
    "cache_tok_s",
    "no_cache_tok_s",
    "speedup",
    "compiled_tok_s",
    "compiled_speedup",
    "compiled_first_s",
    "greedy_equal",
]


def compile_options(choice: str, device: torch.device, smoke: bool) -> dict[str, Any] | None:
    """``generate``'s ``compile`` argument for ``--compile`` (None: not measured)."""
    if choice == "off" or (choice == "auto" and device.type != "cuda" and not smoke):
        return None
    if smoke and device.type != "cuda":
        return {"backend": "eager"}  # the static step captured in one graph, no code generation
    if choice == "cudagraphs":  # CUDA graphs of the traced step, no inductor code generation
        return {"backend": "cudagraphs"} if device.type == "cuda" else {"backend": "eager"}
    return {"mode": "reduce-overhead"} if device.type == "cuda" else {}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the generation benchmark and return its results."""
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="*", default=[1, 8])
    p.add_argument("--prompt", type=int, default=16, help="prompt length in tokens")
    p.add_argument("--new", type=int, default=None, help="new tokens per sequence")
    p.add_argument(
        "--compile",
        choices=["auto", "on", "off", "cudagraphs"],
        default="auto",
        help="also time the compiled static decode step: auto = on CUDA only (CUDA graphs); "
        "on = also on the CPU (inductor: a long first compile); cudagraphs = torch.compile's "
        "cudagraphs backend (CUDA graphs without inductor: a shorter first call, to compare)",
    )
    a = p.parse_args(argv)
    device = setup(a)
    if not kit_available("generation", "generate") or not kit_available(
        "models", "GPT", "GPTConfig"
    ):
        print("kit generate/GPT not available: nothing to measure")
        return {"benchmark": "generation", "rows": []}
    from transformer_lab.generation import compile_decode_step, generate
    from transformer_lab.models import GPT, GPTConfig

    if a.smoke:
        cfg = GPTConfig(vocab_size=65, n_ctx=32, d_model=32, n_layers=2, n_heads=2)
        new, repeats, warmup = 8, 1, 0
    elif device.type == "cpu":
        cfg = GPTConfig(vocab_size=65, n_ctx=256, d_model=128, n_layers=4, n_heads=4)
        new, repeats, warmup = a.new or 200, a.repeats or 3, 1 if a.warmup is None else a.warmup
    else:
        cfg = GPTConfig(vocab_size=65, n_ctx=256, d_model=384, n_layers=6, n_heads=6)
        new, repeats, warmup = a.new or 240, a.repeats or 5, 1 if a.warmup is None else a.warmup
    prompt_len = min(a.prompt, cfg.n_ctx - new)
    if prompt_len < 1:
        raise ValueError(f"--new={new} leaves no room for a prompt within n_ctx={cfg.n_ctx}")
    options = compile_options(a.compile, device, a.smoke)
    torch.manual_seed(0)
    model = GPT(cfg).to(device).eval()
    rows: list[dict[str, Any]] = []
    dims = {
        "n_ctx": cfg.n_ctx,
        "d_model": cfg.d_model,
        "n_layers": cfg.n_layers,
        "n_heads": cfg.n_heads,
    }
    result = {
        "benchmark": "generation",
        "machine": machine(device),
        "date": now(),
        "settings": {**dims, "repeats": repeats, "smoke": a.smoke, "compile": options},
        "rows": rows,
    }
    for B in a.batches:
        idx = torch.randint(
            cfg.vocab_size, (B, prompt_len), generator=torch.Generator().manual_seed(B)
        )
        idx = idx.to(device)
        kinds: dict[str, dict[str, Any]] = {
            "cache": {"use_cache": True},
            "no_cache": {"use_cache": False},
        }
        if options is not None:  # one compiled step per batch size, reused by every call
            kinds["compiled"] = {"decode_step": compile_decode_step(model, B, options)}
        # Greedy tokens first (this also compiles the static step for this batch size: its
        # first call's time, compilation included, is what a student waits for once).
        greedy, first_s = {}, {}
        for name, kw in kinds.items():
            t0 = time.perf_counter()
            greedy[name] = generate(model, idx, new, top_k=1, **kw)
            if device.type == "cuda":
                torch.cuda.synchronize()
            first_s[name] = time.perf_counter() - t0
        same = all(torch.equal(g, greedy["no_cache"]) for g in greedy.values())

        def run(kw: dict[str, Any], idx: torch.Tensor = idx) -> None:
            g = torch.Generator(device=device).manual_seed(0)
            generate(model, idx, new, generator=g, **kw)

        med = alternate(
            {name: lambda kw=kw, run=run: run(kw) for name, kw in kinds.items()},
            device,
            repeats=repeats,
            warmup=warmup,
            clock=a.clock,
        )
        compiled = med.get("compiled")
        row = {
            "batch": B,
            "prompt": prompt_len,
            "new_tokens": new,
            "cache_tok_s": B * new / med["cache"],
            "no_cache_tok_s": B * new / med["no_cache"],
            "speedup": med["no_cache"] / med["cache"],
            "compiled_tok_s": "n/a" if compiled is None else B * new / compiled,
            "compiled_speedup": "n/a" if compiled is None else med["no_cache"] / compiled,
            "compiled_first_s": "n/a" if compiled is None else first_s["compiled"],
            "greedy_equal": "yes" if same else "NO",
        }
        rows.append(row)
        line = (
            f"B={B}: cache {row['cache_tok_s']:.0f} tok/s, "
            f"no cache {row['no_cache_tok_s']:.0f} tok/s, speed-up {row['speedup']:.2f}x"
        )
        if compiled is not None:
            line += f", compiled {row['compiled_tok_s']:.0f} tok/s ({row['compiled_speedup']:.2f}x)"
        print(f"{line}, greedy outputs equal: {row['greedy_equal']}", flush=True)
        write_json(a.out, result)  # each batch's row as soon as it exists
    print_table(rows, COLUMNS)
    return result


if __name__ == "__main__":
    main()
