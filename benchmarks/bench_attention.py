"""Item 1: the kit's attention paths against ``F.scaled_dot_product_attention``.

For each sequence length T the script times, side by side in one process (alternating
repetitions, warm-up first, medians), forward and forward+backward:

* ``loop``   -- ``self_attention_loop`` (Python loops over tokens; small T only) on one
  sequence (T, D), against projections + SDPA on the same sequence;
* ``matrix`` -- ``self_attention_matrix`` on the same (T, D) sequence, same reference;
* ``sdpa_fn`` -- the kit's batched ``scaled_dot_product_attention`` on (B, H, T, Dh), which
  returns the weights, against bare ``F.scaled_dot_product_attention``;
* ``mha_weights`` / ``mha_fast`` -- ``MultiHeadAttention`` with and without returning the
  weights, against the same four projections around bare SDPA ("bare SDPA on the same shapes",
  issue 2's target: ``mha_fast`` within 10%, ratio <= 1.10); ``mha_fast_causal`` passes a
  boolean causal mask, ``mha_fast_is_causal`` uses ``is_causal=True`` (the kernel's causal mode).

Peak memory is CUDA's allocator high-water mark on GPU and ``n/a`` on CPU. A log-log plot of
time against T (quadratic growth has slope 2) is written next to the JSON results.

Shape letters: B batch, T time, D model width, H heads, Dh head width.
Reference: Vaswani et al. 2017, "Attention Is All You Need", section 3.2.
"""

from __future__ import annotations

import inspect
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _common import (
    alternate,
    base_parser,
    kit_available,
    machine,
    now,
    peak_memory_mb,
    print_table,
    setup,
    write_json,
)
from torch import Tensor


def _fwd_bwd(fn: Callable[[], Tensor], leaves: list[Tensor]) -> Callable[[], None]:
    """A callable running ``fn`` and back-propagating the sum of its output."""

    def run() -> None:
        for t in leaves:
            t.grad = None
        fn().float().sum().backward()

    return run


def _no_grad(fn: Callable[[], Tensor]) -> Callable[[], Any]:
    def run() -> Any:
        with torch.no_grad():
            return fn()

    return run


def _first(x: Any) -> Tensor:
    """The output tensor of a function that may return ``(out, weights)``."""
    return x[0] if isinstance(x, tuple) else x


def _mha_call(
    mha: torch.nn.Module, x: Tensor, mask: Tensor | None, weights: bool, **extra: Any
) -> Callable[[], Tensor]:
    """Call the kit's ``MultiHeadAttention`` asking for (or not) the attention weights."""
    params = inspect.signature(mha.forward).parameters
    kwargs: dict[str, Any] = {"mask": mask, **extra}
    if "need_weights" in params:
        kwargs["need_weights"] = weights
    elif "return_weights" in params:
        kwargs["return_weights"] = weights
    elif not weights:
        raise RuntimeError("kit MultiHeadAttention has no switch for its fast path")
    return lambda: _first(mha(x, x, x, **kwargs))


def _bare_mha(mha: torch.nn.Module, x: Tensor, n_heads: int, causal: bool) -> Callable[[], Tensor]:
    """The same projections as ``mha`` around bare SDPA: the issue-2 reference."""

    def run() -> Tensor:
        B, T, D = x.shape
        q = (
            F.linear(x, mha.q_proj.weight, mha.q_proj.bias).view(B, T, n_heads, -1).transpose(1, 2)
        )  # (B, H, T, Dh)
        k = (
            F.linear(x, mha.k_proj.weight, mha.k_proj.bias).view(B, T, n_heads, -1).transpose(1, 2)
        )  # (B, H, T, Dh)
        v = (
            F.linear(x, mha.v_proj.weight, mha.v_proj.bias).view(B, T, n_heads, -1).transpose(1, 2)
        )  # (B, H, T, Dh)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # (B, H, T, Dh)
        a = a.transpose(1, 2).reshape(B, T, D)  # (B, T, D)
        return F.linear(a, mha.out_proj.weight, mha.out_proj.bias)

    return run


def _proj_sdpa(X: Tensor, w: list[Tensor]) -> Callable[[], Tensor]:
    """Row-convention projections of one sequence (T, D) followed by bare SDPA."""

    def run() -> Tensor:
        q = X @ w[0] + w[1]  # (T, D)
        k = X @ w[2] + w[3]  # (T, D)
        v = X @ w[4] + w[5]  # (T, D)
        return F.scaled_dot_product_attention(q[None], k[None], v[None])[0]  # (T, D)

    return run


def build_cases(
    T: int, B: int, D: int, H: int, device: torch.device, loop_max_t: int
) -> dict[str, tuple[Callable[[], Tensor], Callable[[], Tensor], list[Tensor]]]:
    """name -> (kit callable, reference callable, leaves needing grads) for length ``T``."""
    gen = torch.Generator().manual_seed(T)
    cases: dict[str, tuple[Callable[[], Tensor], Callable[[], Tensor], list[Tensor]]] = {}

    def rand(*shape: int, scale: float = 1.0) -> Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(device).requires_grad_()

    has_single = kit_available("attention", "self_attention_loop", "self_attention_matrix")
    if has_single:
        from transformer_lab.attention import self_attention_loop, self_attention_matrix

        X = rand(T, D)
        w = [
            rand(D, D, scale=D**-0.5),
            rand(D),
            rand(D, D, scale=D**-0.5),
            rand(D),
            rand(D, D, scale=D**-0.5),
            rand(D),
        ]
        ref = _proj_sdpa(X, w)
        if loop_max_t >= T:
            cases["loop"] = (lambda: self_attention_loop(X, *w), ref, [X, *w])
        cases["matrix"] = (lambda: self_attention_matrix(X, *w), ref, [X, *w])

    if kit_available("attention", "scaled_dot_product_attention"):
        from transformer_lab.attention import scaled_dot_product_attention as kit_sdpa

        q, k, v = rand(B, H, T, D // H), rand(B, H, T, D // H), rand(B, H, T, D // H)
        cases["sdpa_fn"] = (
            lambda: _first(kit_sdpa(q, k, v)),
            lambda: F.scaled_dot_product_attention(q, k, v),
            [q, k, v],
        )

    if kit_available("attention", "MultiHeadAttention"):
        from transformer_lab.attention import MultiHeadAttention

        torch.manual_seed(T)
        mha = MultiHeadAttention(D, H).to(device)
        x = rand(B, T, D)
        leaves = [x, *mha.parameters()]
        cases["mha_weights"] = (_mha_call(mha, x, None, True), _bare_mha(mha, x, H, False), leaves)
        try:
            cases["mha_fast"] = (
                _mha_call(mha, x, None, False),
                _bare_mha(mha, x, H, False),
                leaves,
            )
            causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
            cases["mha_fast_causal"] = (
                _mha_call(mha, x, causal, False),
                _bare_mha(mha, x, H, True),
                leaves,
            )
            if "is_causal" in inspect.signature(mha.forward).parameters:
                cases["mha_fast_is_causal"] = (
                    _mha_call(mha, x, None, False, is_causal=True),
                    _bare_mha(mha, x, H, True),
                    leaves,
                )
        except RuntimeError as e:
            print(f"skip mha_fast: {e}")
    return cases


def check_agreement(kit: Callable[[], Tensor], ref: Callable[[], Tensor], name: str) -> float:
    """Largest absolute difference between the kit's output and the reference's."""
    with torch.no_grad():
        diff = (kit().float() - ref().float()).abs().max().item()
    if not math.isfinite(diff) or diff > 1e-2:
        raise AssertionError(f"{name}: kit and reference outputs differ by {diff:.3g}")
    return diff


SIDE_COLUMNS = [
    "case",
    "T",
    "fwd kit ms",
    "fwd ref ms",
    "fwd ratio",
    "fwd+bwd kit ms",
    "fwd+bwd ref ms",
    "fwd+bwd ratio",
    "kit peak MiB",
    "ref peak MiB",
]


def side_by_side(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (case, T) with forward and forward+backward figures next to each other."""
    merged: dict[tuple[str, int], dict[str, Any]] = {}
    for r in rows:
        m = merged.setdefault((r["case"], r["T"]), {"case": r["case"], "T": r["T"]})
        m[f"{r['mode']} kit ms"] = r["kit_ms"]
        m[f"{r['mode']} ref ms"] = r["ref_ms"]
        m[f"{r['mode']} ratio"] = r["ratio"]
        if r["mode"] == "fwd+bwd":
            m["kit peak MiB"], m["ref peak MiB"] = r["kit_peak_mib"], r["ref_peak_mib"]
    return list(merged.values())


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Log-log time against T for every case and mode; quadratic growth is slope 2."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, mode in zip(axes, ("fwd", "fwd+bwd"), strict=True):
        sub = [r for r in rows if r["mode"] == mode]
        for case in dict.fromkeys(r["case"] for r in sub):
            pts = [r for r in sub if r["case"] == case]
            ax.plot([r["T"] for r in pts], [r["kit_ms"] for r in pts], "o-", label=f"kit {case}")
        refs = [r for r in sub if r["case"] == "sdpa_fn"] or sub
        ts = sorted({r["T"] for r in refs})
        ref_ms = [next(r["ref_ms"] for r in refs if r["T"] == t) for t in ts]
        ax.plot(ts, ref_ms, "k--", label="F.scaled_dot_product_attention")
        if ts:
            t0, m0 = ts[-1], ref_ms[-1]
            ax.plot(ts, [m0 * (t / t0) ** 2 for t in ts], ":", color="grey", label="~T^2")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_title(mode)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("milliseconds (median)")
    axes[1].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the attention benchmark and return its results."""
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="*", default=None)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--loop-max-t", type=int, default=128, help="longest T for the loop form")
    p.add_argument("--plot", type=Path, default=None, help="png path (default: next to --out)")
    p.add_argument(
        "--min-seconds",
        type=float,
        default=0.3,
        help="timed work per candidate and case at least (short kernels get more repeats)",
    )
    a = p.parse_args(argv)
    device = setup(a)
    if a.smoke:
        lengths, B, repeats, warmup, loop_max = [8, 16], 2, 1, 0, 8
    else:
        cpu = device.type == "cpu"
        lengths = a.lengths or (
            [64, 128, 256, 512, 1024, 2048] if cpu else [64, 128, 256, 512, 1024, 2048, 4096]
        )
        B = a.batch or (2 if cpu else 16)
        repeats, warmup, loop_max = a.repeats or 7, a.warmup or 2, a.loop_max_t
    repeats, warmup = a.repeats or repeats, a.warmup if a.warmup is not None else warmup
    D, H = a.d_model, a.heads
    rows: list[dict[str, Any]] = []
    for T in lengths:
        cases = build_cases(T, B, D, H, device, loop_max)
        if not cases:
            print("kit attention not available: nothing to compare")
            break
        for name, (kit, ref, leaves) in cases.items():
            diff = check_agreement(kit, ref, name)
            for mode in ("fwd", "fwd+bwd"):
                # The loop form is too slow to repeat many times; time it less often.
                reps = max(1, repeats // 3) if name == "loop" else repeats
                if mode == "fwd":
                    k_run, r_run = _no_grad(kit), _no_grad(ref)
                else:
                    k_run, r_run = _fwd_bwd(kit, leaves), _fwd_bwd(ref, leaves)
                try:
                    med = alternate(
                        {"kit": k_run, "ref": r_run},
                        device,
                        repeats=reps,
                        warmup=warmup,
                        clock=a.clock,
                        min_seconds=0.0 if a.smoke else a.min_seconds,
                    )
                    peaks = (peak_memory_mb(k_run, device), peak_memory_mb(r_run, device))
                except torch.cuda.OutOfMemoryError:
                    # Explicit (B, H, T, T) weights outgrow small GPUs (e.g. 16 GB) at large T.
                    print(f"T={T:5d} {name:18s} {mode:8s} out of memory: skipped", flush=True)
                    torch.cuda.empty_cache()
                    continue
                row = {
                    "case": name,
                    "mode": mode,
                    "T": T,
                    "B": 1 if name in ("loop", "matrix") else B,
                    "kit_ms": med["kit"] * 1e3,
                    "ref_ms": med["ref"] * 1e3,
                    "ratio": med["kit"] / med["ref"],
                    "kit_peak_mib": peaks[0],
                    "ref_peak_mib": peaks[1],
                    "max_abs_diff": diff,
                }
                rows.append(row)
                print(
                    f"T={T:5d} {name:18s} {mode:8s} kit {row['kit_ms']:9.3f} ms  "
                    f"ref {row['ref_ms']:9.3f} ms  ratio {row['ratio']:.2f}",
                    flush=True,
                )
    print_table(side_by_side(rows), SIDE_COLUMNS)
    fast = [r for r in rows if r["case"] == "mha_fast"]
    worst = max((r["ratio"] for r in fast), default=None)
    median = statistics.median(r["ratio"] for r in fast) if fast else None
    if worst is not None:
        verdict = "met" if worst <= 1.10 else "not met"
        print(
            f"issue 2 target (mha_fast <= 1.10x bare SDPA at every T and mode): worst ratio "
            f"{worst:.2f} -> {verdict}; median ratio {median:.2f}"
        )
    result = {
        "benchmark": "attention",
        "machine": machine(device),
        "date": now(),
        "settings": {
            "B": B,
            "D": D,
            "H": H,
            "repeats": repeats,
            "min_seconds": 0.0 if a.smoke else a.min_seconds,
            "warmup": warmup,
            "clock": a.clock,
            "smoke": a.smoke,
        },
        "rows": rows,
        "mha_fast_worst_ratio": worst,
        "mha_fast_median_ratio": median,
    }
    out = a.out
    write_json(out, result)
    png = a.plot or (out.with_suffix(".png") if out else None)
    if rows and png is not None:
        png.parent.mkdir(parents=True, exist_ok=True)
        plot(rows, png, f"attention, B={B} D={D} H={H}; {result['machine']}")
    return result


if __name__ == "__main__":
    main()
