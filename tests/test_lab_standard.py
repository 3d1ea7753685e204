"""Every lab follows the lab standard (docs/labs.md), and `labs new` starts one that does.

The standard is code (:mod:`transformer_lab.grading.standard`); this test walks every lab's
source notebook with it, so a lab that drifts (an intro without the grading paragraph, a test
cell whose comment and points disagree, a free code cell, no demo on the student's code...)
fails here with the cell and what to change.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest

from transformer_lab.grading.course import course_settings, list_labs
from transformer_lab.grading.standard import (
    HOW_GRADING_WORKS,
    lint_lab,
    new_lab,
    setup_cell_imports,
    setup_cell_source,
)

REPO = Path(__file__).resolve().parents[1]
LABS = list_labs(REPO)


@pytest.mark.parametrize("lab", LABS)
def test_every_lab_follows_the_standard(lab: str) -> None:
    nb = nbformat.read(str(REPO / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
    assert lint_lab(nb, lab, course_settings(REPO).kit_source) == []


def test_labs_new_starts_a_lab_that_follows_the_standard(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "solutions").mkdir(parents=True)
    shutil.copy(REPO / "nbgrader_config.py", repo / "nbgrader_config.py")
    written = new_lab(repo, "09_vision_transformer", "Vision Transformers", "https://x/kit.whl")
    assert [p.relative_to(repo).as_posix() for p in written] == [
        "solutions/09_vision_transformer/09_vision_transformer.ipynb",
        "transformer_lab/checks/lab09.py",
        "transformer_lab/grading/hidden/lab09.py",
    ]
    nb = nbformat.read(str(written[0]), as_version=4)
    assert lint_lab(nb, "09_vision_transformer", "https://x/kit.whl") == []
    for path in written[1:]:
        compile(path.read_text(), str(path), "exec")
    with pytest.raises(FileExistsError):
        new_lab(repo, "09_vision_transformer", "again")


def test_the_lint_finds_drift() -> None:
    lab = "01_positional_encoding"
    nb = nbformat.read(str(REPO / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
    nb.cells[0].source = nb.cells[0].source.replace(HOW_GRADING_WORKS, "Grading: see below.")
    test = next(c for c in nb.cells if c.source.startswith("# Visible check (2 points)"))
    test.source = test.source.replace("(2 points)", "(3 points)")
    nb.cells.insert(5, nbformat.v4.new_code_cell("print('a free cell')"))
    problems = "\n".join(lint_lab(nb, lab))
    assert "How grading works" in problems
    assert "starts with '# Visible check (2 points)" in problems
    assert "free code cell" in problems


def test_setup_cell_keeps_the_labs_imports_and_nothing_else() -> None:
    source = setup_cell_source("03_x", "https://x", ["import torch", "from torch import nn"])
    assert setup_cell_imports(source) == ["import torch", "from torch import nn"]
    assert 'KIT_SOURCE = "https://x"' in source and 'lab.setup("03_x")' in source
    assert "from transformer_lab.checks import lab03" in source
