"""A course students can take in order, under any release schedule (issue: course in order).

One Colab-like venv without the kit, a loopback "course site" with the student wheel and
``latest.json``, and the labs' release notebooks with the solutions filled in, executed by
nbclient through their setup cells, in the grading profile:

* **every lab locked, answers carried** (the full matrix): labs 01-08 in order in one folder;
  each lab saves the student's passing answers to ``my_answers/`` and the next ones run on them;
* **every lab locked, nothing saved** (reduced: labs 03 and 05): PyTorch stand-ins fill in;
* **a wrong earlier answer saved** (reduced: lab 03): the setup cell names it, the lab's own
  checks still pass;
* **after each deadline** (reduced: labs 04 and 06): the course republishes an unlocked wheel;
  the setup cell upgrades the installed kit in one line and the labs run on the kit's answers.

The full matrix for every schedule would take about four times as long on a 2-core CI machine;
the reduced ones cover what differs between the schedules (where an earlier answer comes from).
Lab 08 trains the kit's ``CausalLMModule``, whose loss, logging and optimizer are lab 04's
answer with no student equivalent: PyTorch stand-ins fill them in every schedule (lab 08 with
every lab locked and nothing saved is ``tests/test_answers.py``'s, in-process and fast).
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from colab_support import errors, fresh_kernel, run, serve, student_notebook, text

from transformer_lab.grading.course import list_labs
from transformer_lab.grading.student import build_student_wheel, build_version

REPO = Path(__file__).resolve().parents[1]
LABS = list_labs(REPO)
# One worker for the whole module: the tests share a venv, and the last one upgrades its kit.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("course_in_order")]
_WRONG_SOFTMAX = "import torch\n\n\ndef softmax(x, dim=-1):\n    return x.exp()\n"


def _publish(site: Path, locked: list[str], moment: dt.datetime) -> str:
    """Build a student wheel into the course site and name it in latest.json; its version."""
    version = build_version("0.1.0", moment)
    wheel = build_student_wheel(REPO, site, locked, version=version).wheel
    (site / "latest.json").write_text(json.dumps({"version": version, "wheel": wheel.name}))
    return version


@pytest.fixture(scope="module")
def course(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The shared venv and course site, with every lab locked (a term's first day)."""
    root = tmp_path_factory.mktemp("course")
    site = root / "site"
    site.mkdir()
    first = _publish(site, LABS, dt.datetime(2026, 9, 1, tzinfo=dt.timezone.utc))
    env = fresh_kernel(root)
    with serve(site) as url:
        yield {"root": root, "site": site, "url": url, "env": env, "version": first}


def _take(course: dict, lab: str, folder: Path, answers: Path) -> object:
    cwd = folder / lab
    cwd.mkdir(parents=True, exist_ok=True)
    nb = student_notebook(lab, course["url"] + "/")
    env = {**course["env"], "TRANSFORMER_LAB_ANSWERS": str(answers)}
    return run(nb, env, cwd)


def _setup_text(done: object) -> str:
    return text(done.cells[1])


def test_every_lab_locked_answers_carried_from_lab_to_lab(course: dict) -> None:
    folder, answers = course["root"] / "carried", course["root"] / "carried" / "my_answers"
    seconds = {}
    for lab in LABS:
        start = time.perf_counter()
        done = _take(course, lab, folder, answers)
        seconds[lab] = round(time.perf_counter() - start)
        assert errors(done) == [], (lab, errors(done))
        assert (answers / f"lab{lab[:2]}.py").is_file(), lab  # this lab's answers were saved
        if lab == "01_positional_encoding":
            assert "Installing the transformer-lab kit from" in _setup_text(done)
        if lab == "08_language_models":  # lab 04's training pieces: stand-ins, then a run
            assert "token_cross_entropy, log_metrics, build_optimizer (04)" in _setup_text(done)
            assert "Skipped " not in "".join(text(c) for c in done.cells)
        if lab == "05_masking":
            setup = _setup_text(done)
            assert "Your saved answers: sinusoidal_encoding" in setup, setup
            assert "MultiHeadAttention" in setup.split("Your saved answers:")[1], setup
    print(f"carried, seconds per lab: {seconds} (total {sum(seconds.values())} s)")


def test_every_lab_locked_nothing_saved_runs_on_pytorch_stand_ins(course: dict) -> None:
    for lab in ("03_multi_head_attention", "05_masking"):
        folder = course["root"] / f"alone-{lab}"
        done = _take(course, lab, folder, folder / "my_answers")
        assert errors(done) == [], (lab, errors(done))
        assert "PyTorch stand-ins (labs still open): " in _setup_text(done)


def test_a_wrong_earlier_answer_is_named_and_the_lab_still_passes(course: dict) -> None:
    folder = course["root"] / "wrong"
    answers = folder / "my_answers"
    answers.mkdir(parents=True)
    (answers / "lab02.py").write_text(_WRONG_SOFTMAX)
    done = _take(course, "03_multi_head_attention", folder, answers)
    setup = _setup_text(done)
    assert "Warning: the demos run on your saved softmax from lab 02_self_attention" in setup
    assert errors(done) == []
    visible = [c for c in done.cells if c.source.startswith("# Visible check")]
    assert visible and all("visible check passed" in text(c) for c in visible)


def test_after_each_deadline_the_setup_cell_upgrades_and_the_labs_run(course: dict) -> None:
    newer = _publish(course["site"], [], dt.datetime(2026, 12, 20, tzinfo=dt.timezone.utc))
    for lab in ("04_transformer_block", "06_decoder_training"):
        folder = course["root"] / f"unlocked-{lab}"
        done = _take(course, lab, folder, folder / "my_answers")
        assert errors(done) == [], (lab, errors(done))
        setup = _setup_text(done)
        if lab == "04_transformer_block":
            assert f"Updating the transformer-lab kit from {course['version']} to {newer}" in setup
        assert f"transformer_lab {newer} | lab {lab[:2]}" in setup
        assert "stand-in" not in setup and "Not in this kit yet" not in setup
