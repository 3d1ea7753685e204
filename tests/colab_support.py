"""A Colab-like kernel for the notebook tests: a fresh venv without the kit, a loopback kit site.

Shared by ``tests/test_setup_cell.py`` and ``tests/test_course_in_order.py``:

* :func:`serve` serves a folder (the student wheel and ``latest.json``) on 127.0.0.1;
* :func:`fresh_kernel` makes a virtual environment that sees this environment's packages
  (torch, Lightning, Jupyter...) but not the kit, registered as the Jupyter kernel ``fresh``;
* :func:`student_notebook` is a lab's release with the solution's answers filled in, installing
  the kit from a given address; :func:`run` executes it with nbclient.
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
from contextlib import contextmanager
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from transformer_lab.grading.course import environment

REPO = Path(__file__).resolve().parents[1]


@contextmanager
def serve(folder: Path) -> Iterator[str]:
    """``http://127.0.0.1:<port>`` serving ``folder`` while the block runs."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def fresh_kernel(root: Path) -> dict[str, str]:
    """A new venv under ``root`` without the kit; returns the environment for :func:`run`."""
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
    return {
        "JUPYTER_PATH": str(root / "kernels"),
        "PIP_NO_INDEX": "1",  # offline: everything but the kit must already be there
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "TRANSFORMER_LAB_PROFILE": "grading",
        "OMP_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
    }


def student_notebook(lab: str, kit_source: str) -> nbformat.NotebookNode:
    """``lab`` as a student who solved it hands it in, installing from ``kit_source``."""
    release = nbformat.read(str(REPO / "labs" / lab / f"{lab}.ipynb"), as_version=4)
    source = nbformat.read(str(REPO / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
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


def run(nb: nbformat.NotebookNode, env: dict[str, str], cwd: Path) -> nbformat.NotebookNode:
    """Execute ``nb`` in the ``fresh`` kernel, in ``cwd``, errors kept in the outputs."""
    with environment(**env):
        client = NotebookClient(
            nb, kernel_name="fresh", timeout=600, allow_errors=True,
            resources={"metadata": {"path": str(cwd)}},
        )  # fmt: skip
        return client.execute()


def text(cell: nbformat.NotebookNode) -> str:
    """What a cell printed (streams, and ``ename: evalue`` of an error)."""
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif out.get("output_type") == "error":
            parts.append(f"{out.get('ename')}: {out.get('evalue')}")
    return "".join(parts)


def errors(nb: nbformat.NotebookNode) -> list[tuple[str, str]]:
    """``(grade id or index, error text)`` of every cell that raised."""
    found = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                gid = cell.metadata.get("nbgrader", {}).get("grade_id", str(i))
                found.append((gid, f"{out.get('ename')}: {out.get('evalue')}"[:300]))
    return found
