"""Lab 02 (self-attention): the shared notebook tests with this lab's numbers.

The tests are :class:`notebook_support.LabNotebookTests`.
"""

from __future__ import annotations

from typing import ClassVar

from notebook_support import LabNotebookTests

from transformer_lab.checks import lab02


class TestLab02(LabNotebookTests):
    LAB = "02_self_attention"
    CHECKS = lab02
    POINTS: ClassVar[dict[str, int]] = {
        "softmax": 3,
        "self_attention_loop": 4,
        "self_attention_matrix": 3,
        "sdpa": 8,
        "written": 5,
    }
    TABLE = (("softmax", 3), ("self_attention_loop", 4), ("scaled_dot_product", 8))
    ANSWERS = (
        "setup",
        "softmax",
        "self_attention_loop",
        "self_attention_matrix",
        "scaled_dot_product_attention",
    )
    TEST_CELLS = 13
    LEAK = "amax(dim"
