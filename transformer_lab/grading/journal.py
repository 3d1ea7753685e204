"""What a ``labs grade`` run has already put in the gradebook, so a stopped run can resume.

A run writes each submission's grades, feedback and executed notebook the moment it has them,
but its report (``grading_report.json``) and ``grades.csv`` only at the end. The journal,
``COURSE/.grading/journal.jsonl``, closes that gap: one line per submission accepted into the
gradebook (its result, and the digest of the notebook graded), appended and flushed as it is
accepted. ``labs grade --resume`` after a stopped run (Ctrl-C, a lost coordinator, a cluster
allocation that ran out) grades only the submissions the journal does not hold with the same
notebook, and reports all of them; a run that ends normally removes its journal, and a run
without ``--resume`` starts a new one.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["Journal", "notebook_digest"]

JOURNAL = "journal.jsonl"


def notebook_digest(path: Path) -> str:
    """sha256 of a submission's notebook and its ``timestamp.txt``: what was handed in."""
    digest = hashlib.sha256(Path(path).read_bytes())
    stamp = Path(path).parent / "timestamp.txt"
    if stamp.is_file():
        digest.update(b"\0" + stamp.read_bytes())
    return digest.hexdigest()


class Journal:
    """The results a run accepted, one JSON line each (see the module docstring).

    Args:
        folder: the course's working folder (``COURSE/.grading``).
        resume: keep what an earlier, stopped run recorded (otherwise start afresh).
    """

    def __init__(self, folder: Path, *, resume: bool) -> None:
        self.path = Path(folder) / JOURNAL
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.done: dict[tuple[str, str], dict[str, Any]] = {}
        if resume and self.path.is_file():
            for line in self.path.read_text().splitlines():
                try:
                    entry = json.loads(line)
                    key = (entry["result"]["student"], entry["result"]["lab"])
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a line cut short when the run stopped
                self.done[key] = entry
        elif self.path.exists():
            self.path.unlink()

    def finished(self, student: str, lab: str, digest: str) -> dict[str, Any] | None:
        """The recorded result of this submission, if it was graded from the same notebook."""
        entry = self.done.get((student, lab))
        return entry["result"] if entry and entry.get("digest") == digest else None

    def add(self, result: dict[str, Any], digest: str) -> None:
        """Record one accepted result (flushed to disk before this returns)."""
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"digest": digest, "result": result}) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def close(self) -> None:
        """The run ended and its report holds everything: the journal is no longer needed."""
        self.path.unlink(missing_ok=True)
