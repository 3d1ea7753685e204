"""Tests of the grading side's shared file helpers (transformer_lab.grading.course)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from transformer_lab.grading.course import write_json


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
