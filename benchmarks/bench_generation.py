"""Item 5: generation speed of the kit's GPT with and without its KV cache.

Without a cache every new token re-runs the model over the whole prefix (cost ~ T^2 per
sequence); with the cache each step feeds only the newest token and attends to the stored
keys and values (cost ~ T). The script times ``transformer_lab.generation.generate`` both ways,
alternating repetitions, at batch 1 and batch 8, and reports new tokens per second (batch
times new tokens over wall time) and the speed-up. Before timing it checks that greedy
decoding gives the same tokens both ways.

Reference: Pope et al. 2022, "Efficiently Scaling Transformer Inference" (KV caching).
"""

from __future__ import annotations

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
    "greedy_equal",
]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the generation benchmark and return its results."""
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="*", default=[1, 8])
    p.add_argument("--prompt", type=int, default=16, help="prompt length in tokens")
    p.add_argument("--new", type=int, default=None, help="new tokens per sequence")
    a = p.parse_args(argv)
    device = setup(a)
    if not kit_available("generation", "generate") or not kit_available(
        "models", "GPT", "GPTConfig"
    ):
        print("kit generate/GPT not available: nothing to measure")
        return {"benchmark": "generation", "rows": []}
    from transformer_lab.generation import generate
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
    torch.manual_seed(0)
    model = GPT(cfg).to(device).eval()
    rows: list[dict[str, Any]] = []
    for B in a.batches:
        idx = torch.randint(
            cfg.vocab_size, (B, prompt_len), generator=torch.Generator().manual_seed(B)
        )
        idx = idx.to(device)
        with torch.no_grad():
            greedy_cached = generate(model, idx, new, top_k=1, use_cache=True)
            greedy_plain = generate(model, idx, new, top_k=1, use_cache=False)
        same = bool(torch.equal(greedy_cached, greedy_plain))

        def run(cache: bool, idx: torch.Tensor = idx) -> None:
            with torch.no_grad():
                g = torch.Generator(device=device).manual_seed(0)
                generate(model, idx, new, use_cache=cache, generator=g)

        med = alternate(
            {"cache": lambda run=run: run(True), "no_cache": lambda run=run: run(False)},
            device,
            repeats=repeats,
            warmup=warmup,
            clock=a.clock,
        )
        row = {
            "batch": B,
            "prompt": prompt_len,
            "new_tokens": new,
            "cache_tok_s": B * new / med["cache"],
            "no_cache_tok_s": B * new / med["no_cache"],
            "speedup": med["no_cache"] / med["cache"],
            "greedy_equal": "yes" if same else "NO",
        }
        rows.append(row)
        print(
            f"B={B}: cache {row['cache_tok_s']:.0f} tok/s, "
            f"no cache {row['no_cache_tok_s']:.0f} tok/s, speed-up {row['speedup']:.2f}x, "
            f"greedy outputs equal: {row['greedy_equal']}",
            flush=True,
        )
    print_table(rows, COLUMNS)
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
        "settings": {**dims, "repeats": repeats, "smoke": a.smoke},
        "rows": rows,
    }
    write_json(a.out, result)
    return result


if __name__ == "__main__":
    main()
