"""The log of torch operations a structural check asks for, taken where the student's code runs.

A structural check (a loop form whose work grows with the tokens, a matrix form whose work does
not) compares the operations an answer runs. Under the grader's judge the kernel
(:mod:`transformer_lab.judge.kernel`) takes the log and returns it as data; the visible checks
(:mod:`transformer_lab.checks._common`) take it themselves when they run in one process.
"""

from __future__ import annotations

from torch import Tensor
from torch.overrides import TorchFunctionMode

__all__ = ["OpLog"]


class OpLog(TorchFunctionMode):
    """Records the name and output shapes of every torch operation run under it.

    Structural checks (a loop form whose work grows with the tokens, a matrix form whose work
    does not) compare such logs; under the grader's judge the log is taken in the kernel, where
    the student's code runs, and returned as data.
    """

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, list[tuple[int, ...]]]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        shapes = [tuple(o.shape) for o in outs if isinstance(o, Tensor)]
        self.ops.append((getattr(func, "__name__", repr(func)), shapes))
        return out
