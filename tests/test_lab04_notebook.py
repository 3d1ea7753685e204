"""Lab 04 (the transformer block): the shared notebook tests with this lab's numbers.

The tests are :class:`notebook_support.LabNotebookTests`. Training cells stay out of the fast
run; the slow round trip grades them.
"""

from __future__ import annotations

from typing import ClassVar

from notebook_support import LabNotebookTests

from transformer_lab.checks import lab04


class TestLab04(LabNotebookTests):
    LAB = "04_transformer_block"
    CHECKS = lab04
    # Points per graded idea, as the notebook's introduction states them.
    POINTS: ClassVar[dict[str, int]] = {
        "layer_norm": 6,
        "feed_forward": 4,
        "encoder_block": 8,
        "trained_encoder": 3,
        "written": 6,
    }
    TABLE = (("layer_norm", 6), ("class FeedForward", 4), ("class EncoderBlock", 8))
    ANSWERS = ("setup", "imports", "layer_norm", "feed_forward", "encoder_block")
    TEST_CELLS = 10  # every layer-norm, feed-forward and block test cell; no training
    SKIP = "trained"
    LEAK = "torch.sqrt(var + eps)"
