"""The setup cell installs the kit where it is missing, as on Colab, and says so when it cannot.

End to end and offline: a fresh virtual environment that has torch and the kit's dependencies but
not the kit (like Colab) runs lab 01 whose setup cell points at the student package served from a
loopback HTTP server; the cell installs it, and the lab (answers filled in) then runs with every
visible check passing. Pointed at an address that does not answer, the setup cell stops with one
line that names the address and what to do.
"""

from __future__ import annotations

import functools
import http.server
import json
import re
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from transformer_lab.grading.course import environment, list_labs
from transformer_lab.grading.student import build_student_wheel

REPO = Path(__file__).resolve().parents[1]
LAB = "01_positional_encoding"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The student package (every lab locked, as on a term's first day) over loopback HTTP."""
    folder = tmp_path_factory.mktemp("site")
    wheel = build_student_wheel(REPO, folder, list_labs(REPO)).wheel
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/{wheel.name}"
    server.shutdown()


@pytest.fixture
def fresh_kernel(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, str]]:
    """A new venv that sees this environment's packages (torch, Lightning...) but not the kit."""
    root = tmp_path_factory.mktemp("colab")
    venv = root / "venv"
    # Without its own pip and setuptools: those of this environment serve (on Colab they are
    # recent; a new venv's bundled setuptools is older than torch requires).
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300
    )
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # A plain path entry, not a site dir: this environment's editable install of the kit (a
    # .pth file of its own) is not processed there, so the kit is missing as on Colab.
    Path(site, "host_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = subprocess.run(
        [str(python), "-c", "import torch, lightning; import transformer_lab"],
        capture_output=True,
        text=True,
        cwd=root,
    )
    assert "No module named 'transformer_lab'" in probe.stderr, probe.stderr
    spec = root / "kernels" / "kernels" / "fresh"
    spec.mkdir(parents=True)
    argv = [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec.joinpath("kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "fresh", "language": "python"})
    )
    env = {
        "JUPYTER_PATH": str(root / "kernels"),
        "PIP_NO_INDEX": "1",  # offline: everything but the kit must already be there
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "TRANSFORMER_LAB_PROFILE": "grading",
        "OMP_NUM_THREADS": "1",
    }
    return str(python), env


def _student_notebook(kit_source: str) -> nbformat.NotebookNode:
    """Lab 01 as a student who solved it hands it in, installing from ``kit_source``."""
    release = nbformat.read(str(REPO / "labs" / LAB / f"{LAB}.ipynb"), as_version=4)
    source = nbformat.read(str(REPO / "solutions" / LAB / f"{LAB}.ipynb"), as_version=4)
    answers = {
        c.metadata["nbgrader"]["grade_id"]: re.sub(r"\s*### (BEGIN|END) SOLUTION", "", c.source)
        for c in source.cells
        if c.metadata.get("nbgrader", {}).get("solution") and c.cell_type == "code"
    }
    for cell in release.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in answers:
            cell.source = answers[gid]
        if gid == "setup":
            cell.source = re.sub(
                r'^KIT_SOURCE = ".*"$', f'KIT_SOURCE = "{kit_source}"', cell.source, flags=re.M
            )
    return release


def _run(nb: nbformat.NotebookNode, env: dict[str, str], cwd: Path) -> nbformat.NotebookNode:
    with environment(**env):
        client = NotebookClient(
            nb, kernel_name="fresh", timeout=600, allow_errors=True,
            resources={"metadata": {"path": str(cwd)}},
        )  # fmt: skip
        return client.execute()


def _text(cell: nbformat.NotebookNode) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif out.get("output_type") == "error":
            parts.append(f"{out.get('ename')}: {out.get('evalue')}")
    return "".join(parts)


def test_setup_cell_installs_the_student_package_and_the_lab_runs(
    wheel_server: str, fresh_kernel: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    _, env = fresh_kernel
    done = _run(_student_notebook(wheel_server), env, tmp_path)
    setup = done.cells[1]
    assert f"Installing the transformer-lab kit from {wheel_server}" in _text(setup)
    assert "transformer_lab 0.1.0 | lab 01 | profile: grading" in _text(setup)
    errors = [
        (i, _text(c))
        for i, c in enumerate(done.cells)
        if any(o.get("output_type") == "error" for o in c.get("outputs", []))
    ]
    assert errors == []
    visible = [c for c in done.cells if c.source.startswith("# Visible check")]
    assert visible and all("visible check passed" in _text(c) for c in visible)


def test_setup_cell_says_in_one_line_when_it_cannot_install(
    fresh_kernel: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    _, env = fresh_kernel
    nb = _student_notebook("http://127.0.0.1:9/transformer_lab-0.1.0-py3-none-any.whl")
    nb.cells = nb.cells[:3]
    done = _run(nb, env, tmp_path)
    error = next(o for o in done.cells[1].outputs if o.output_type == "error")
    assert error.ename == "SystemExit"
    assert error.evalue.startswith("Could not install the kit from http://127.0.0.1:9/")
    assert "ask your instructor" in error.evalue and "\n" not in error.evalue
