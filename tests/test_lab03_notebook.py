"""Lab 03 (multi-head attention): the shared notebook tests with this lab's numbers.

The tests are :class:`notebook_support.LabNotebookTests`.
"""

from __future__ import annotations

from typing import ClassVar

from notebook_support import LabNotebookTests

from transformer_lab.checks import lab03


class TestLab03(LabNotebookTests):
    LAB = "03_multi_head_attention"
    CHECKS = lab03
    POINTS: ClassVar[dict[str, int]] = {
        "split_heads": 3,
        "merge_heads": 2,
        "mha": 7,
        "load": 3,
        "written": 3,
    }
    TABLE = (("split_heads", 3), ("class MultiHeadAttention", 7), ("load_torch", 3))
    ANSWERS = ("setup", "split_heads", "merge_heads", "MultiHeadAttention", "load_torch_weights")
    TEST_CELLS = 11
    LEAK = "in_proj_weight.split(D)"  # a line of the model answer to load_torch_weights
