"""The plots of runs under their older name: the same functions as :mod:`transformer_lab.figures`.

They live in ``transformer_lab/figures/plots.py``; the notebooks' ``from transformer_lab import
plots`` (and ``from transformer_lab.plots import read_metrics_csv``) keeps working through this
module.
"""

from __future__ import annotations

from transformer_lab._lazy import lazy_exports
from transformer_lab.figures import PLOTS

__all__ = sorted(PLOTS)

__getattr__, __dir__ = lazy_exports("transformer_lab.figures", PLOTS)
