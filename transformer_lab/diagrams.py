"""The labs' diagrams under their older name: the same functions as :mod:`transformer_lab.figures`.

The diagrams live one module per lab in ``transformer_lab/figures/``
(``transformer_lab/figures/lab02.py`` to ``transformer_lab/figures/lab08.py``), drawn with the one
vocabulary of ``transformer_lab/figures/draw.py``. The notebooks'
``from transformer_lab import diagrams`` keeps working through this module.
"""

from __future__ import annotations

from transformer_lab._lazy import lazy_exports
from transformer_lab.figures import DIAGRAMS

__all__ = sorted(DIAGRAMS)

__getattr__, __dir__ = lazy_exports("transformer_lab.figures", DIAGRAMS)
