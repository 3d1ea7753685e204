"""Tests of the grading side's shared helpers (transformer_lab.grading.course)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from transformer_lab.grading.course import grading_env, scratch_gradebook, write_json


def test_write_json_replaces_the_record_and_keeps_non_ascii_names(tmp_path: Path) -> None:
    path = tmp_path / "lms" / "record.json"
    write_json(path, {"students": ["old"]})
    write_json(path, {"students": ["Zoë Łukasiewicz"]})
    assert json.loads(path.read_text(encoding="utf-8")) == {"students": ["Zoë Łukasiewicz"]}
    assert "Zoë" in path.read_text(encoding="utf-8")
    assert [p.name for p in path.parent.iterdir()] == ["record.json"]


def test_a_write_that_fails_leaves_the_old_record_whole_and_no_temporary_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "grading_report.json"
    write_json(path, {"runs": [1]})
    with pytest.raises(TypeError, match="not JSON serializable"):
        write_json(path, {"runs": [object()]})
    assert json.loads(path.read_text()) == {"runs": [1]}
    assert [p.name for p in tmp_path.iterdir()] == ["grading_report.json"]


def test_new_gradebooks_record_nbgraders_schema_revision_asked_of_alembic_once(
    tmp_path: Path,
) -> None:
    """Inside ``grading_env`` nbgrader's ``alembic heads`` runs once per process (the first new
    gradebook), and every new gradebook still records the revision the command gives."""
    import nbgrader.api
    from nbgrader.api import Gradebook

    with grading_env():
        for name in ("first", "second", "third"):
            with Gradebook(f"sqlite:///{tmp_path / name}.db"):
                pass
        asked = nbgrader.api.get_alembic_version
        assert asked.cache_info().misses == 1, asked.cache_info()
        revision = asked.__wrapped__()  # nbgrader's own call, run again
    for name in ("first", "second", "third"):
        with sqlite3.connect(tmp_path / f"{name}.db") as db:
            assert db.execute("select version_num from alembic_version").fetchall() == [(revision,)]


def test_only_a_scratch_gradebook_is_written_without_waiting_for_the_disk(tmp_path: Path) -> None:
    """nbgrader's connections to a scratch gradebook (a lab's template, a submission's own
    copy) skip SQLite's sync on commit while the block runs; the course's gradebook, and the
    scratch one after the block, keep SQLite's default (``synchronous = FULL``, 2)."""
    from nbgrader.api import Gradebook
    from sqlalchemy import text

    def synchronous(path: Path) -> int:
        with Gradebook(f"sqlite:///{path}") as gb:
            gb.update_or_create_assignment("lab")  # a commit, as nbgrader makes them
            return gb.db.execute(text("PRAGMA synchronous")).scalar()

    course, scratch = tmp_path / "gradebook.db", tmp_path / "work" / "gradebook.db"
    scratch.parent.mkdir()
    with grading_env():
        with scratch_gradebook(tmp_path / "work" / ".." / "work" / "gradebook.db"):
            assert synchronous(scratch) == 0
            assert synchronous(course) == 2
        assert synchronous(scratch) == 2
    with sqlite3.connect(scratch) as db:  # what was written unsynced is all there
        assert db.execute("select name from assignment").fetchall() == [("lab",)]
