"""``labs render``: a lab executed with its solution in the student package, to look at."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest
from conftest import NEEDS

from transformer_lab.grading.cli import main

REPO = Path(__file__).resolve().parents[1]
LAB = "01_positional_encoding"
pytestmark = pytest.mark.slow


def test_render_shows_the_students_own_figures(tmp_path: Path) -> None:
    assert main(["--repo", str(REPO), "render", "01", "--out", str(tmp_path)]) == 0
    nb = nbformat.read(str(tmp_path / f"{LAB}.ipynb"), as_version=4)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert errors == []
    text = "".join(str(o.get("text", "")) for c in nb.cells for o in c.get("outputs", []))
    assert "(This uses your sinusoidal_encoding.)" in text
    html = (tmp_path / f"{LAB}.html").read_text()
    assert html.count("<img") >= 4 and "<math" in html
    if not (shutil.which("chromium") or shutil.which("google-chrome")):
        pytest.skip(NEEDS["chromium"])  # the notebook and HTML above were checked all the same
    assert (tmp_path / f"{LAB}.png").stat().st_size > 10_000
    assert (tmp_path / f"{LAB}.pdf").read_bytes()[:5] == b"%PDF-"
