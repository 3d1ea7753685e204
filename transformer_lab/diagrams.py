"""Diagrams drawn in code for the labs: what the lecture draws on the board, as matplotlib figures.

Each function returns a ``matplotlib.figure.Figure`` (built without pyplot, so it also works
headless) that a lab's demo cell displays. Shapes in labels follow the course's row convention
(``X`` is ``(N, D)``, tokens in rows) and the shape letters of ``transformer_lab.attention``.

Sections, one per lab; a lab adds its diagrams to its own section.
"""

from __future__ import annotations

__all__: list[str] = []

# --------------------------------------------------------------------------------------
# Lab 02: self-attention (queries, keys, values and the matrix shapes)
# --------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------
# Lab 03: multi-head attention (splitting and merging heads)
# --------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------
# Lab 04: the transformer block (post-norm and pre-norm)
# --------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------
# Lab 05: masking
# --------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------
# Lab 06: the encoder-decoder
# --------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------
# Lab 07: the NLP pipeline
# --------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------
# Lab 08: language models
# --------------------------------------------------------------------------------------
