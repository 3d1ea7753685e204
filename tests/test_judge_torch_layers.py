"""A correct answer built on PyTorch's own layers keeps every point through the real grader.

Lab 04 allows ``nn.MultiheadAttention`` inside ``EncoderBlock``. The judge mirrors such a block
(``nn.MultiheadAttention`` and its ``NonDynamicallyQuantizableLinear`` rebuilt as torch's own
layers) and sends dropout settings to the kernel with each request; the in-process tests
(``test_mistake_costs``) hold that without a kernel. This one grades such a submission with
``labs grade`` in the sandbox, where the mirror crosses a process boundary.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from judge_support import grade_one

REPO = Path(__file__).resolve().parents[1]
LAB = "04_transformer_block"

TORCH_ATTENTION_BLOCK = '''\
class EncoderBlock(nn.Module):
    """Post- or pre-norm encoder block on torch's nn.MultiheadAttention."""

    def __init__(
        self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0, norm_first: bool = False
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.n_heads = n_heads
        self.self_attn = nn.MultiheadAttention(d_model, n_heads, batch_first=True)
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def _attend(self, h: Tensor, mask: Tensor | None) -> Tensor:
        B, T, _ = h.shape
        blocked = None
        if mask is not None:  # (B*H, T, T), True = may NOT attend
            blocked = ~mask.expand(B, self.n_heads, T, T).reshape(B * self.n_heads, T, T)
        return self.self_attn(h, h, h, attn_mask=blocked, need_weights=False)[0]

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        if self.norm_first:
            x = x + self.dropout1(self._attend(self.norm1(x), mask))
            return x + self.dropout2(self.ff(self.norm2(x)))
        x = self.norm1(x + self.dropout1(self._attend(x, mask)))
        return self.norm2(x + self.dropout2(self.ff(x)))
'''

pytestmark = pytest.mark.slow


def _submission() -> nbformat.NotebookNode:
    nb = nbformat.read(str(REPO / "solutions" / LAB / f"{LAB}.ipynb"), as_version=4)
    cell = next(
        c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "encoder_block"
    )
    cell.source = TORCH_ATTENTION_BLOCK
    return nb


def test_an_encoder_block_on_torch_attention_keeps_every_point(tmp_path: Path) -> None:
    result = grade_one(tmp_path / "course", "torch_attention", LAB, _submission())
    assert result["status"] == "graded", result
    assert result["auto_score"] == result["auto_max"] > 0, result
    assert not result["flags"], result
