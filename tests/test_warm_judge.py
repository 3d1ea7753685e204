"""The grader imports what a lab's judge will import once per run, before any submission.

Otherwise the first submission a worker grades carries seconds of Lightning and torchmetrics
imports (lab 06: 4 of its 8 judge seconds), and a benchmark of few copies reads them as
per-submission cost. It also renders one feedback page and reads one cell as IPython runs it
(nbconvert's HTML exporter, the page's sanitiser, IPython's input transformers): each
submission's child, forked from the grader, then finds them loaded.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_warm_judge_imports_the_labs_checks_and_libraries_and_survives_a_missing_lab() -> None:
    code = (
        "import sys\n"
        "from transformer_lab.grading.grade import warm_judge\n"
        f"warm_judge({str(REPO)!r}, ['99_no_such_lab', '06_decoder_training'])\n"
        "need = ['lightning', 'torchmetrics', 'transformer_lab.grading.hidden.lab06',\n"
        "        'transformer_lab.checks.lab06', 'nbconvert.exporters.html', 'bs4',\n"
        "        'IPython.core.inputtransformer2']\n"
        "print([m for m in need if m not in sys.modules])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_the_kernels_font_cache_is_copied_from_a_loaded_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A grader that has loaded matplotlib's font manager copies its own font list into the
    course, starting no Python process for it; one that has not builds it in a fresh process
    (as every grading test's first run does)."""
    import matplotlib
    import matplotlib.font_manager as fm

    from transformer_lab.grading import grade

    name = f"fontlist-v{fm.FontManager.__version__}.json"
    monkeypatch.setattr(subprocess, "run", None)  # a process started now would fail
    cache = grade._matplotlib_cache(tmp_path)
    assert [p.name for p in cache.iterdir()] == [name]
    assert (cache / name).read_bytes() == Path(matplotlib.get_cachedir(), name).read_bytes()
    assert fm.json_load(cache / name).ttflist
    monkeypatch.delitem(sys.modules, "matplotlib.font_manager")
    assert grade._loaded_font_list() is None
