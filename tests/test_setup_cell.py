"""The setup cell installs the kit where it is missing, as on Colab, and says so when it cannot.

End to end and offline: a fresh virtual environment that has torch and the kit's dependencies but
not the kit (like Colab) runs lab 01 whose setup cell points at the student package served from a
loopback HTTP server; the cell installs it, and the lab (answers filled in) then runs with every
visible check passing. Pointed at an address that does not answer, the setup cell stops with one
line that names the address and what to do.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from colab_support import fresh_kernel as make_fresh_kernel
from colab_support import run, serve, student_notebook, text

from transformer_lab.grading.course import list_labs
from transformer_lab.grading.student import build_student_wheel

REPO = Path(__file__).resolve().parents[1]
LAB = "01_positional_encoding"
pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def wheel_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The student package (every lab locked, as on a term's first day) over loopback HTTP."""
    folder = tmp_path_factory.mktemp("site")
    wheel = build_student_wheel(REPO, folder, list_labs(REPO)).wheel
    with serve(folder) as site:
        yield f"{site}/{wheel.name}"


@pytest.fixture
def fresh_kernel(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A new venv that sees this environment's packages (torch, Lightning...) but not the kit."""
    return make_fresh_kernel(tmp_path_factory.mktemp("colab"))


def _student_notebook(kit_source: str) -> nbformat.NotebookNode:
    return student_notebook(LAB, kit_source)


def test_setup_cell_installs_the_student_package_and_the_lab_runs(
    wheel_server: str, fresh_kernel: dict[str, str], tmp_path: Path
) -> None:
    env = fresh_kernel
    done = run(_student_notebook(wheel_server), env, tmp_path)
    setup = done.cells[1]
    assert f"Installing the transformer-lab kit from {wheel_server}" in text(setup)
    assert "transformer_lab 0.1.0 | lab 01 | profile: grading" in text(setup)
    errors = [
        (i, text(c))
        for i, c in enumerate(done.cells)
        if any(o.get("output_type") == "error" for o in c.get("outputs", []))
    ]
    assert errors == []
    visible = [c for c in done.cells if c.source.startswith("# Visible check")]
    assert visible and all("visible check passed" in text(c) for c in visible)


def test_setup_cell_says_in_one_line_when_it_cannot_install(
    fresh_kernel: dict[str, str], tmp_path: Path
) -> None:
    env = fresh_kernel
    nb = _student_notebook("http://127.0.0.1:9/transformer_lab-0.1.0-py3-none-any.whl")
    nb.cells = nb.cells[:3]
    done = run(nb, env, tmp_path)
    error = next(o for o in done.cells[1].outputs if o.output_type == "error")
    assert error.ename == "SystemExit"
    assert error.evalue.startswith("Could not install the kit from http://127.0.0.1:9/")
    assert "ask your instructor" in error.evalue and "\n" not in error.evalue
