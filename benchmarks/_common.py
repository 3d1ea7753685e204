"""Shared helpers for the benchmark scripts: devices, timing, memory, mixed precision, output.

Every benchmark compares the kit with a reference *side by side in one process*: the two
candidates are timed in alternating repetitions after a warm-up, and the median of the
repeats is reported, so that drift on a busy machine (other jobs, thermal throttling) hits
both equally. Ratios are always computed from medians taken in the same run.

The scripts are run as files (``python benchmarks/bench_attention.py``), so this module is
imported as ``_common`` from the script's own directory; it is not part of the package.

Reference: the timing discipline follows ``torch.utils.benchmark`` (synchronise the device
around each timed call, warm up first, report robust statistics).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent


def default_corpus() -> Path:
    """Where the benchmarks read Tiny Shakespeare unless ``--data`` says otherwise.

    ``$TRANSFORMER_LAB_TINY_SHAKESPEARE`` if set (gpu.sh points it at the copy carried to a GPU
    machine), else a copy beside the checkout (``../shared/data/``) if there is one, else the
    kit's download cache (``~/.cache/transformer_lab/``, filled by any run that downloaded it).
    """
    env = os.environ.get("TRANSFORMER_LAB_TINY_SHAKESPEARE", "").strip()
    if env:
        return Path(env)
    beside = REPO_ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
    if beside.is_file():
        return beside
    cache = os.environ.get("TRANSFORMER_LAB_CACHE", "").strip()
    folder = Path(cache).expanduser() if cache else Path.home() / ".cache" / "transformer_lab"
    return folder / "tinyshakespeare.txt"


TINY_SHAKESPEARE = default_corpus()


def kit_available(module: str, *names: str) -> bool:
    """True when ``transformer_lab.<module>`` imports and defines every name in ``names``.

    The kit is built concurrently with these benchmarks; a script measures what exists and
    reports the rest as ``n/a (kit: ... missing)`` instead of failing.
    """
    try:
        mod = __import__(f"transformer_lab.{module}", fromlist=list(names) or ["__name__"])
    except Exception:
        return False
    return all(hasattr(mod, n) for n in names)


def grading_sandbox() -> str:
    """The grader's sandbox for a benchmark: ``required`` where bubblewrap works, else ``off``.

    A benchmark grades the kit's own solutions, not students' code, so without bubblewrap it
    measures unsandboxed (and says so in its results) instead of failing.
    """
    from transformer_lab.grading.sandbox import find_bwrap

    return "required" if find_bwrap() is not None else "off"


def base_parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the options every benchmark shares."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: checks it runs")
    p.add_argument("--repeats", type=int, default=None, help="timed repetitions per candidate")
    p.add_argument("--warmup", type=int, default=None, help="untimed repetitions first")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--out", type=Path, default=None, help="write results as JSON here")
    p.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="time kernels by wall clock or by this process's CPU time (steadier on a shared "
        "CPU with --threads 1; ignored on CUDA)",
    )
    return p


def setup(args: argparse.Namespace) -> torch.device:
    """Apply ``--threads`` and resolve ``--device`` (``auto`` picks CUDA when present)."""
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    name = args.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device={args.device!r} but CUDA is not available")
    if name.startswith("cuda") and getattr(args, "clock", "wall") == "cpu":
        args.clock = "wall"  # GPU work does not show in the process's CPU time
    # TF32 stays at PyTorch's default (off for matmuls): the plain runs are plain fp32, and the
    # kit's recipes choose their own precision.
    return torch.device(name)


def machine(device: torch.device) -> str:
    """One line naming the hardware and the library versions a figure was measured with."""
    if device.type == "cuda":
        hw = torch.cuda.get_device_name(device)
    else:
        hw = f"{os.cpu_count()}-core CPU ({platform.machine()}), {torch.get_num_threads()} threads"
    return f"{hw}, torch {torch.__version__}, python {platform.python_version()}"


def now() -> str:
    """Current UTC time, to the minute."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def sync(device: torch.device) -> None:
    """Wait for queued device work so wall-clock time measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
Clock = str | Callable[[], float]


def time_call(fn: Callable[[], Any], device: torch.device, clock: Clock = "wall") -> float:
    """Seconds taken by one call of ``fn``, device synchronised on both sides.

    ``clock="cpu"`` counts this process's CPU time instead of wall time: with one CPU thread it
    equals the wall time of an idle machine and ignores the time other jobs hold the core, so
    it is the steadier measure on a shared CPU (meaningless for GPU work, which it omits). A
    callable returning seconds is used as the clock itself (the tests pass a simulated one).
    """
    if not callable(clock) and clock not in CLOCKS:
        raise ValueError(f"clock={clock!r} is not one of {sorted(CLOCKS)}")
    now_ = clock if callable(clock) else CLOCKS[clock]
    sync(device)
    t0 = now_()
    fn()
    sync(device)
    return now_() - t0


def alternate(
    candidates: dict[str, Callable[[], Any]],
    device: torch.device,
    *,
    repeats: int,
    warmup: int,
    clock: Clock = "wall",
    min_seconds: float = 0.0,
    max_repeats: int = 1000,
) -> dict[str, float]:
    """Median seconds per call of each candidate, timed in interleaved rounds.

    Each round runs every candidate once (order rotated every round so none always goes
    first); ``warmup`` rounds are discarded. Short calls get more rounds: timing goes on until
    every candidate has ``repeats`` timed calls *and* the candidates together have
    ``min_seconds`` of timed work each on average (at most ``max_repeats`` rounds), so that a
    sub-millisecond kernel is not judged on seven samples, while a slow candidate beside a fast
    one (the loop form beside SDPA) does not multiply the rounds.

    Args:
        candidates: name -> zero-argument callable.
        device: where the work runs (for synchronisation).
        repeats: timed rounds, at least.
        warmup: untimed rounds first.
        clock: ``"wall"``, ``"cpu"`` or a callable clock (see :func:`time_call`).
        min_seconds: average timed work per candidate to reach before stopping (0: exactly
            ``repeats`` rounds).
        max_repeats: cap on the timed rounds.

    Returns:
        name -> median seconds.
    """
    if repeats < 1 or warmup < 0 or max_repeats < repeats:
        raise ValueError(
            f"repeats={repeats} must be >= 1 and <= max_repeats={max_repeats}, warmup={warmup} >= 0"
        )
    names = list(candidates)
    times: dict[str, list[float]] = {n: [] for n in names}
    r = 0
    while True:
        timed = r - warmup
        if timed >= repeats and (
            timed >= max_repeats or sum(map(sum, times.values())) >= min_seconds * len(names)
        ):
            break
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            t = time_call(candidates[n], device, clock)
            if r >= warmup:
                times[n].append(t)
        r += 1
    return {n: statistics.median(ts) for n, ts in times.items()}


def peak_memory_mb(fn: Callable[[], Any], device: torch.device) -> float | None:
    """Peak device memory (MiB) allocated during one call of ``fn``, above what was live before.

    Only CUDA keeps an allocator high-water mark; on CPU this returns ``None`` (reported as
    ``n/a``) rather than an RSS figure polluted by the Python heap and other threads.
    """
    if device.type != "cuda":
        return None
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    fn()
    sync(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def amp_dtype(device: torch.device) -> torch.dtype | None:
    """Autocast dtype for ``device``: bf16 where supported, else fp16 on CUDA, none on CPU."""
    if device.type != "cuda":
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


@contextlib.contextmanager
def autocast(device: torch.device, dtype: torch.dtype | None) -> Iterator[None]:
    """``torch.autocast`` when ``dtype`` is set, a no-op otherwise."""
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=dtype):
        yield


def fmt(x: float | None, spec: str = ".3g") -> str:
    """Format a figure, ``n/a`` for missing ones; large figures with thousands separators."""
    if x is None:
        return "n/a"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float) and abs(x) >= 1000:
        return f"{x:,.0f}"
    return format(x, spec)


def print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    """Print rows as a GitHub-markdown table (pasteable into RESULTS.md)."""
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        cells = [row.get(c) for c in columns]
        print("| " + " | ".join(fmt(c) if not isinstance(c, str) else c for c in cells) + " |")
    sys.stdout.flush()


def write_json(path: Path | None, payload: dict[str, Any]) -> None:
    """Write ``payload`` as indented JSON to ``path`` (parents created); nothing if ``None``."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"wrote {path}")
