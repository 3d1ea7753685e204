"""Every notebook installs the kit (on Colab) from the one address the course configures."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(ROOT.glob("solutions/*/*.ipynb")) + sorted(ROOT.glob("labs/*/*.ipynb"))


def _declared_source() -> str:
    from transformer_lab.grading.course import course_settings

    return course_settings(ROOT).kit_source


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: f"{p.parent.parent.name}/{p.stem}")
def test_setup_cell_installs_from_the_declared_source(notebook: Path) -> None:
    cells = [c for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]
    setup = "".join(cells[0]["source"])
    sources = re.findall(r'^KIT_SOURCE\s*=\s*"([^"]+)"', setup, flags=re.M)
    assert sources == [_declared_source()], (
        f"{notebook}: the first code cell must set KIT_SOURCE once to {_declared_source()!r}, "
        f"c.TransformerLab.kit_source of nbgrader_config.py (found {sources}): run "
        "`transformer-lab labs build`"
    )


def test_there_are_notebooks() -> None:
    assert len(NOTEBOOKS) >= 8


def test_license_is_an_spdx_string() -> None:
    """The table form (``{ text = "MIT" }``) makes setuptools print a deprecation, three times."""
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^license\s*=\s*"MIT"\s*$', text, flags=re.M), 'license = "MIT" (SPDX)'
    requires = re.search(r"^requires\s*=\s*\[(.*)\]", text, flags=re.M)
    assert requires and "setuptools>=77" in requires.group(1), "SPDX strings need setuptools 77"


# Text files of the repository that could cite the curriculum.
_CITING = sorted(
    p
    for pattern in ("*.md", "docs/*.md", "transformer_lab/**/*.py", "configs/*.yaml")
    for p in ROOT.glob(pattern)
)


@pytest.mark.parametrize(
    "path",
    [p for p in _CITING],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_the_repository_cites_only_itself(path: Path) -> None:
    """A clone stands alone: nothing points at ../shared, which only this workplace has."""
    assert "../shared" not in path.read_text(encoding="utf-8")
