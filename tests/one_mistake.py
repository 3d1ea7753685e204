"""A submission per lab that makes one typical mistake, and what its feedback must say.

Each entry edits one answer of the solution (the release filled in with the solution's
answers, as a student who finished would submit it): the part it breaks, the old and new text,
and words the judge's message for that part must hold. Used by ``test_feedback_render.py``,
which grades these through the real ``labs grade`` and renders the feedback pages
(``labs render --feedback``) as the student would see them.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import nbformat

from transformer_lab.grading.render import filled_release


class OneMistake(NamedTuple):
    part: str  # the answer cell's grade id (the part's name)
    old: str
    new: str
    says: str  # words that name the mistake in the judge's first message for it


ONE_MISTAKE = {
    "01_positional_encoding": OneMistake(
        "sinusoidal_encoding",
        "pe[:, 0::2] = torch.sin(angles)\n    pe[:, 1::2] = torch.cos(angles)",
        "pe[:, 0::2] = torch.cos(angles)\n    pe[:, 1::2] = torch.sin(angles)",
        "sin and cos are swapped",
    ),
    "02_self_attention": OneMistake(
        "scaled_dot_product_attention", " / math.sqrt(q.shape[-1])", "", "without scaling"
    ),
    "03_multi_head_attention": OneMistake(
        "split_heads",
        "x.view(B, T, n_heads, D // n_heads).transpose(1, 2)",
        "x.reshape(B, n_heads, T, D // n_heads)",
        "reshape(B, H, T, Dh) straight away",
    ),
    "04_transformer_block": OneMistake(
        "layer_norm",
        "(centred**2).mean(dim=-1, keepdim=True)",
        "x.var(dim=-1, keepdim=True)",
        "the unbiased variance",
    ),
    "05_masking": OneMistake(
        "causal_mask",
        "steps[None, :] <= steps[:, None]",
        "steps[None, :] >= steps[:, None]",
        "your mask is upper-triangular",
    ),
    "06_decoder_training": OneMistake(
        "sequence_loss",
        "return -picked[real].sum() / real.sum()",
        "return -picked.mean()",
        "padding counts",
    ),
    "07_nlp_pipeline": OneMistake(
        "apply_temperature", "return logits / t", "return logits * t", "multiplied by t"
    ),
    "08_language_models": OneMistake(
        "gpu_days",
        "flops / (peak_flops * utilization)",
        "flops / peak_flops",
        "ignore the utilization",
    ),
}


#: A mistake whose cost reaches the cells that judge a model the notebook trained (lab 06's
#: translator, trained by the student's own ``train_translator`` in a demo cell): its catalogue
#: id in the spec, and the edit. One epoch (40 steps) under-trains the translator, so the two
#: trained-model cells lose their points besides the two Trainer-settings cells.
TRAINED_CELLS_MISTAKE = (
    "06_decoder_training",
    "train_translator train_epochs",
    OneMistake("train_translator", "max_steps=max_steps,", "max_epochs=1,", "max_steps=max_steps"),
)


def submission(repo: Path, lab: str, mistake: OneMistake | None = None) -> nbformat.NotebookNode:
    """The solution's answers in the release, with one mistake made (the lab's own by default)."""
    nb = filled_release(repo, lab)
    mistake = mistake or ONE_MISTAKE[lab]
    cell = next(
        c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == mistake.part
    )
    assert mistake.old in cell.source, (lab, mistake.part)
    cell.source = cell.source.replace(mistake.old, mistake.new)
    return nb
