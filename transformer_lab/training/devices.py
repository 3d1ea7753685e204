"""Device and numeric-precision choice, and the ``transformer-lab info`` report.

Mixed precision roughly halves memory traffic on GPUs with tensor cores, but which half-width
format is safe depends on the hardware: bfloat16 keeps float32's exponent range and needs no loss
scaling, so it is used wherever the GPU supports it (Ampere and newer); older GPUs such as the T4
only have float16, which Lightning pairs with a gradient scaler (``"16-mixed"``). On CPUs mixed
precision brings no speed-up for models this small, so they train in full ``"32-true"``.
See the Lightning docs, "N-bit precision", and Micikevicius et al., "Mixed Precision Training"
(2018).

The user always has the last word: ``--trainer.precision`` on the command line overrides the
automatic choice.
"""

from __future__ import annotations

import platform
import sys
from importlib import metadata
from typing import TextIO


def choose_accelerator() -> str:
    """Return the accelerator Lightning would pick: ``"cuda"``, ``"mps"`` or ``"cpu"``."""
    import torch

    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return "cpu"


def choose_precision(accelerator: str | None = None) -> str:
    """Return the Lightning precision string for ``accelerator`` (default: the detected one).

    Args:
        accelerator: ``"cuda"`` (or ``"gpu"``), ``"mps"`` or ``"cpu"``; ``None`` detects it.

    Returns:
        ``"bf16-mixed"`` on a CUDA GPU with bfloat16 support, ``"16-mixed"`` on an older CUDA
        GPU, ``"32-true"`` on CPU and Apple MPS.

    Raises:
        ValueError: for an unknown accelerator name.
    """
    accelerator = choose_accelerator() if accelerator is None else accelerator
    if accelerator in ("cuda", "gpu"):
        import torch

        if not torch.cuda.is_available():
            return "32-true"
        return "bf16-mixed" if torch.cuda.is_bf16_supported() else "16-mixed"
    if accelerator in ("cpu", "mps"):
        return "32-true"
    raise ValueError(f"accelerator={accelerator!r} is not one of 'cuda', 'gpu', 'mps', 'cpu'")


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def device_description(accelerator: str | None = None) -> str:
    """Describe the device in words, e.g. ``"cuda: NVIDIA T4 (1 device)"`` or ``"cpu: 2 cores"``."""
    import os

    import torch

    accelerator = choose_accelerator() if accelerator is None else accelerator
    if accelerator == "cuda":
        count = torch.cuda.device_count()
        return f"cuda: {torch.cuda.get_device_name(0)} ({count} device{'s' * (count != 1)})"
    if accelerator == "mps":
        return "mps: Apple GPU"
    return f"cpu: {platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def print_info(file: TextIO | None = None) -> None:
    """Print device, chosen precision and library versions (``transformer-lab info``).

    Args:
        file: where to write; standard output by default.
    """
    import torch

    import transformer_lab

    out = sys.stdout if file is None else file
    accelerator = choose_accelerator()
    rows = [
        ("device", device_description(accelerator)),
        ("accelerator", accelerator),
        ("precision", f"{choose_precision(accelerator)} (override with --trainer.precision)"),
        ("python", platform.python_version()),
        ("torch", torch.__version__),
        ("lightning", _version("lightning")),
        ("torchmetrics", _version("torchmetrics")),
        ("transformer_lab", transformer_lab.__version__),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}", file=out)
