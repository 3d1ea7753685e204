"""``transformer-lab labs collect``: an LMS's "download all submissions" into ``COURSE/submitted``.

Students hand in through a learning management system; nbgrader grades
``submitted/<student>/<lab>/``. This module is nbgrader's ``zip_collect`` for the four LMSs
the kit knows, built from nbgrader's own plugins (:class:`~nbgrader.plugins.ExtractorPlugin`
and :class:`~nbgrader.plugins.FileNameCollectorPlugin`, ``nbgrader/plugins/zipcollect.py``)
with one named-group regular expression per LMS, plus what ``zip_collect`` leaves out:

* student ids through a roster (nbgrader's ``db student import`` CSV: ``id,first_name,
  last_name,email`` and an optional ``lms_id`` column: Moodle's participant number, Canvas's
  user id, Blackboard's user name);
* a reason for every file that is not placed (not a notebook, an unknown student, two
  notebooks, an archive inside the archive, a notebook of another lab, a name that does not
  follow the LMS's naming): nothing is dropped silently;
* the LMS archive is only read: it is extracted into a temporary folder; archives inside it are
  never opened;
* a submission already in ``COURSE`` is never overwritten silently: as ``zip_collect`` does, the
  newer one (by submission time) is kept; the other is moved to ``COURSE/lms/superseded/``, or
  reported when no times allow a choice;
* the submission time is written as ``timestamp.txt`` (``zip_collect``'s format, what
  nbgrader's ``CourseDirectory.get_existing_timestamp`` reads) and as the notebook's mtime;
* what each placed file was called in the LMS is kept in ``COURSE/lms/<lms>-<lab>.json``:
  ``labs export`` needs the LMS's ids (Moodle's participant numbers, Canvas's user ids) to write
  grades and feedback the LMS can import.

The file naming of each LMS (what ``FORMATS`` matches), read from the LMSs' own code:

* Moodle, "Download all submissions" (``mod/assign/classes/downloader.php``): the prefix
  ``Full Name_<participant>_assignsubmission_file`` (the name's own ``_`` written as spaces),
  as a folder per student when "Download submissions in folders" is on (the default:
  ``<prefix>/<file>`` since 4.1, ``<prefix>_/<file>`` before; subfolders kept), else
  ``<prefix>_<file>``. Moodle's "Upload multiple feedback files in a zip"
  (``mod/assign/feedback/file/importziplib.php``) reads the same prefixes back.
* Canvas, "Download Submissions": ``<name>_[late_]<user id>_<attachment id>_<file>``, where
  ``<name>`` is the sortable name squashed to lower-case letters of any script (``doejane``,
  ``núñezjosé``); a re-upload's file ends ``-1``, ``-2``. Canvas's "Re-upload submissions"
  reads the first two all-digit parts of a name as user and attachment id.
* Blackboard Learn, "Download assignment": ``<Assignment>_<user name>_attempt_<YYYY-MM-DD-
  HH-MM-SS>_<file>`` plus a receipt ``<Assignment>_<user name>_attempt_<time>.txt`` per
  attempt; both names may hold ``_``: the roster's ``lms_id`` (the user name) tells them apart.
* Google Classroom: an assignment's Drive folder downloaded as a zip. Files students upload keep
  their own names; Classroom's "Make a copy for each student" names copies ``Student Name -
  <title>``. Drive's zip renames files of one name, ``<name> (1).<ext>``, ``(2)``... With
  the Drive API's listing of that folder (``files.list`` with ``fields=files(id,name,owners(
  emailAddress,displayName),modifiedTime,md5Checksum)``, saved as JSON: ``--drive-listing``),
  each file is placed by its Drive **owner**'s e-mail, matched to the roster's ``email`` or
  ``lms_id`` (a renamed ``(1)`` copy by its content's md5, where the listing has it); without
  one the kit expects ``Student Name - <anything>`` and also accepts ``<anything> - Student
  Name``.

Identity and time come only from what the LMS wrote, never from a name a student chose: the
LMS's part of an entry is its first part (Moodle's folder or prefix; Canvas's first
``_<user>_<attachment>_``; Blackboard's first ``_attempt_<time>``), and a student's upload is
named after it, so an upload named like another student's entry stays the uploader's. Google
Classroom's download says nothing about who uploaded a file: without Drive's listing of owners,
two files naming one student place neither (reported as ambiguous).

Blackboard names carry the submission time; the others do not, so for them the time is the
archive entry's modification time (when the LMS wrote the file: Moodle and Canvas stamp each
entry with the file's upload time), or the file's mtime for an already extracted folder, read
in ``--timezone`` (default UTC) because zip times carry no zone.
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import json
import os
import re
import shutil
import tempfile
import unicodedata
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from nbgrader.plugins import ExtractorPlugin, FileNameCollectorPlugin
from nbgrader.utils import unzip

from transformer_lab.grading.course import GradingError, read_notebook, select_labs, write_json

__all__ = [
    "FORMATS",
    "CollectReport",
    "DriveFile",
    "DriveListing",
    "LmsFormat",
    "Roster",
    "Student",
    "collect",
    "collected_files",
    "course_roster",
    "lms_record",
    "read_timestamp",
    "save_roster",
]

ARCHIVE_EXTS = (".zip", ".gz", ".tgz", ".tar", ".bz2", ".xz", ".7z", ".rar")
TIMESTAMP = "timestamp.txt"
LMS_DIR = "lms"
ROSTER = "roster.csv"


@dataclass(frozen=True)
class LmsFormat:
    """How one LMS names the files of its "download all submissions".

    Attributes:
        name: ``moodle``, ``canvas``, ``blackboard`` or ``classroom``.
        named_regexp: for nbgrader's ``FileNameCollectorPlugin``, matched against the path
            inside the archive; groups ``student_id`` (what names the student in the LMS) and
            ``file_id`` (nbgrader's), optionally ``lms_id``, ``timestamp``, ``late``, ``prefix``
            (the part before the file's own name, reused for feedback uploads), ``other``.
        example: a file name it matches (for error messages and the docs).
        time_format: ``strptime`` format of the ``timestamp`` group.
        receipt: files that are the LMS's own receipts, not submissions.
    """

    name: str
    named_regexp: str
    example: str
    time_format: str = ""
    receipt: str = ""


#: A Blackboard attempt's own part of a name: the first ``_attempt_<time>`` in it.
_BB_TIME = r"\d{4}-\d\d-\d\d-\d\d-\d\d-\d\d"
_BB_OUTER = rf"(?P<outer>(?:(?!_attempt_{_BB_TIME})[^/])+)"

FORMATS: dict[str, LmsFormat] = {
    # Moodle replaces "_" in the full name by " " (downloader.php), so the first "_<digits>_"
    # ends the name; the prefix is the archive entry's first part (the folder, or the flat
    # file's own prefix): what a student names a file inside their folder never counts.
    "moodle": LmsFormat(
        "moodle",
        r"^(?P<prefix>(?P<student_id>[^_/]+)_(?P<lms_id>\d+)_assignsubmission_"
        r"(?P<plugin>[a-z]+))(?:_?/(?:[^/]+/)*|_)(?P<file_id>[^/]+)$",
        "Jane Doe_123456_assignsubmission_file/01_positional_encoding.ipynb",
    ),
    # Canvas: the squashed sortable name keeps Unicode letters; the first
    # "[_late]_<user id>_<attachment id>_" ends the LMS's part. Canvas downloads are flat.
    "canvas": LmsFormat(
        "canvas",
        r"^(?P<prefix>(?P<student_id>[^/]*?)(?:_(?P<late>(?i:late)))?_(?P<lms_id>\d+)_"
        r"(?P<attachment>\d+)_)(?P<file_id>[^/]+)$",
        "doejane_late_123456_7890123_01_positional_encoding.ipynb",
    ),
    # Blackboard: "<assignment>_<user name>" before the first "_attempt_<time>"; both may
    # hold "_", so the user name is told apart by the roster (or the assignment name all
    # entries share). A student's file named like an attempt comes after it and never counts.
    "blackboard": LmsFormat(
        "blackboard",
        rf"^(?P<prefix>{_BB_OUTER}_attempt_(?P<timestamp>{_BB_TIME})_)(?P<file_id>[^/]+)$",
        "Lab 1_jdoe_attempt_2026-10-02-14-30-00_01_positional_encoding.ipynb",
        time_format="%Y-%m-%d-%H-%M-%S",
        receipt=rf"^{_BB_OUTER}_attempt_{_BB_TIME}\.txt$",
    ),
    # Google Classroom's Drive download carries no owner: "Student Name - <title>" is all
    # there is (Classroom's own copies are named so, but a student chooses an upload's name),
    # so a student named by two files gets neither, and the report says so.
    "classroom": LmsFormat(
        "classroom",
        r"^(?:.*/)?(?P<student_id>[^/]+?) - (?P<other>[^/]+?)(?P<file_id>\.[^./]+)?$",
        "Jane Doe - 01_positional_encoding.ipynb",
    ),
}


class LmsCollector(FileNameCollectorPlugin):
    """nbgrader's file-name collector with one LMS's ``named_regexp`` (any file extension).

    Every file is matched, not only notebooks: a file the LMS named properly but that is not a
    notebook is reported as such rather than as a badly named file.
    """

    def collect(self, submitted_file: str) -> dict | None:
        return self._match(submitted_file)


class LmsExtractor(ExtractorPlugin):
    """nbgrader's extractor that opens only the LMS's own archive, never one inside it.

    A student's zip inside the download is copied as a file (and then reported), because its
    contents were not handed in through the LMS's naming and cannot be attributed safely. A
    symbolic link in an unpacked folder is never followed (it could point at another student's
    file, or anywhere on the instructor's machine): it is listed in ``links`` and reported.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.links: list[str] = []

    def extract(self, archive_path: str, extracted_path: str) -> None:
        for root, dirs, files in os.walk(archive_path):
            target = Path(extracted_path) / Path(root).relative_to(archive_path)
            target.mkdir(parents=True, exist_ok=True)
            for name in [*files, *dirs]:
                source = os.path.join(root, name)
                if os.path.islink(source) and not (
                    root == archive_path and name.endswith(tuple(self.zip_ext))
                ):
                    self.links.append(Path(source).relative_to(archive_path).as_posix())
            for name in files:
                source = os.path.join(root, name)
                if root == archive_path and name.endswith(tuple(self.zip_ext)):
                    unzip(source, str(target), zip_ext=self.zip_ext, tree=False)
                elif not os.path.islink(source):
                    shutil.copy(source, target / name, follow_symlinks=False)


# --------------------------------------------------------------------------------------
# The roster
# --------------------------------------------------------------------------------------


def _norm(text: str) -> str:
    """Lower case, accents off, whitespace collapsed: how names are compared."""
    decomposed = unicodedata.normalize("NFKD", text)
    plain = "".join(c for c in decomposed if not unicodedata.combining(c))
    return " ".join(plain.casefold().split())


def _squash(text: str) -> str:
    """Letters and digits only, any script (Canvas keeps ``ñ``, ``张``): ``doejane``."""
    return re.sub(r"[\W_]", "", _norm(text))


@dataclass(frozen=True)
class Student:
    """One roster row (nbgrader's ``db student import`` columns and the kit's ``lms_id``)."""

    id: str
    first_name: str = ""
    last_name: str = ""
    email: str = ""
    lms_id: str = ""

    @property
    def full_name(self) -> str:
        return " ".join(p for p in (self.first_name, self.last_name) if p) or self.id


class Roster:
    """Students by every key an LMS may name them with."""

    def __init__(self, students: list[Student]) -> None:
        self.students = students
        self._keys: dict[str, list[Student]] = {}
        for s in students:
            keys = {s.id.casefold(), _norm(s.full_name), _squash(s.last_name + s.first_name)}
            keys |= {_squash(s.first_name + s.last_name)}
            if s.email:
                keys |= {s.email.casefold(), s.email.split("@")[0].casefold()}
            if s.lms_id:
                keys |= {f"lms:{s.lms_id}"}
            for key in keys - {""}:
                self._keys.setdefault(key, []).append(s)

    @classmethod
    def read(cls, path: Path) -> Roster:
        """Read a roster CSV (``id`` column required).

        Raises:
            GradingError: no such file, no ``id`` column, or a repeated id.
        """
        if not Path(path).is_file():
            raise GradingError(f"roster {path} does not exist")
        with open(path, newline="", encoding="utf-8-sig") as handle:
            rows = list(csv.DictReader(handle))
        if rows and "id" not in rows[0]:
            raise GradingError(
                f"roster {path} has no 'id' column (columns: {', '.join(rows[0])}); expected "
                "nbgrader's `db student import` format: id,first_name,last_name,email[,lms_id]"
            )
        names = ("id", "first_name", "last_name", "email", "lms_id")
        students = [Student(**{k: (row.get(k) or "").strip() for k in names}) for row in rows]
        seen: set[str] = set()
        for s in students:
            if not s.id or s.id in seen:
                raise GradingError(f"roster {path}: student id {s.id!r} is empty or repeated")
            seen.add(s.id)
        return cls(students)

    def find(self, *, lms_id: str = "", names: tuple[str, ...] = ()) -> Student | None:
        """The one student with this LMS id, else named so; ``None`` if none or several."""
        return self.match(lms_id=lms_id, names=names)[0]

    def match(self, *, lms_id: str = "", names: tuple[str, ...] = ()) -> tuple[Student | None, str]:
        """The student with this LMS id, else the one named so; else ``None`` and why.

        The LMS's own id decides first; a name decides only when one roster student has it.
        """
        if lms_id and (by_id := self._unique(self._keys.get(f"lms:{lms_id}", []))):
            return by_id[0], ""
        for name in names:
            for key in dict.fromkeys((name.casefold(), _norm(name), _squash(name))):
                found = self._unique(self._keys.get(key, []))
                if len(found) == 1:
                    return found[0], ""
                if found:
                    ids = ", ".join(s.id for s in found)
                    return None, (
                        f"ambiguous: {len(found)} roster students are called {name!r} ({ids}): "
                        "add their lms_id to the roster"
                    )
        said = " / ".join(repr(n) for n in names) + (f" (LMS id {lms_id})" if lms_id else "")
        return None, f"unknown student: {said} is not in the roster (add them, or their lms_id)"

    def by_account(self, email: str) -> list[Student]:
        """The students whose ``email`` (or ``lms_id``) is this account, exactly (any case)."""
        key = email.strip().casefold()
        if not key:
            return []
        return [
            s for s in self.students if key in (s.email.strip().casefold(), s.lms_id.casefold())
        ]

    @staticmethod
    def _unique(students: list[Student]) -> list[Student]:
        return list({s.id: s for s in students}.values())


def _slug(name: str) -> str:
    """A student id made from an LMS name when there is no roster (``Jane Doe`` -> ``jane_doe``)."""
    return re.sub(r"[^a-z0-9]+", "_", _norm(name)).strip("_") or "unknown"


# --------------------------------------------------------------------------------------
# Google Drive's listing of a Classroom folder: who owns each file
# --------------------------------------------------------------------------------------

#: Drive's zip download renames files of one name: ``lab.ipynb``, ``lab (1).ipynb``, ...
_DRIVE_COPY = re.compile(r"^(?P<stem>.+?) ?\((?P<n>\d+)\)(?P<ext>\.[^./ ]+)?$")


@dataclass(frozen=True)
class DriveFile:
    """One file of a Drive ``files.list`` answer: its name, owner, time and content hash."""

    id: str
    name: str
    owner: str
    owner_name: str = ""
    modified: dt.datetime | None = None
    md5: str = ""


class DriveListing:
    """The Drive API's listing of a Classroom assignment folder: each file's owner.

    Read from the JSON of ``files.list`` (``{"files": [...]}``), several pages of it (a list of
    such answers, or ``{"pages": [...]}``) or a bare list of files; each file needs ``name``
    and ``owners[].emailAddress``; ``modifiedTime`` and ``md5Checksum`` are used where present.
    """

    def __init__(self, files: list[DriveFile], path: Path) -> None:
        self.path = path
        self.by_name: dict[str, list[DriveFile]] = {}
        for f in files:
            self.by_name.setdefault(unicodedata.normalize("NFC", f.name), []).append(f)

    @classmethod
    def read(cls, path: Path) -> DriveListing:
        """Read a saved ``files.list`` answer.

        Raises:
            GradingError: no such file, not JSON, or not a ``files.list`` answer (named).
        """
        path = Path(path)
        if not path.is_file():
            raise GradingError(f"--drive-listing {path} does not exist")
        try:
            data = json.loads(path.read_text(encoding="utf-8-sig"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise GradingError(f"--drive-listing {path} is not JSON ({exc})") from exc
        pages = data.get("pages", [data]) if isinstance(data, dict) else data
        bare = isinstance(pages, list) and all(isinstance(p, dict) for p in pages)
        if bare and pages and not any("files" in p for p in pages):
            pages = [{"files": pages}]  # a bare list of files
        if not isinstance(pages, list) or not all(
            isinstance(p, dict) and isinstance(p.get("files", []), list) for p in pages
        ):
            raise GradingError(
                f"--drive-listing {path} is not the Drive API's files.list answer "
                '({"files": [{"name": ..., "owners": [{"emailAddress": ...}]}, ...]})'
            )
        files = [cls._file(entry, path) for page in pages for entry in page.get("files", [])]
        return cls(files, path)

    @staticmethod
    def _file(entry: Any, path: Path) -> DriveFile:
        owners = entry.get("owners") if isinstance(entry, dict) else None
        name = entry.get("name") if isinstance(entry, dict) else None
        emails = [o.get("emailAddress") for o in owners or [] if isinstance(o, dict)]
        if not isinstance(name, str) or not emails or not all(emails):
            raise GradingError(
                f"--drive-listing {path}: the entry {json.dumps(entry)[:160]} has no name or no "
                "owners[].emailAddress: list with fields=files(id,name,owners(emailAddress,"
                "displayName),modifiedTime,md5Checksum)"
            )
        modified = None
        if isinstance(entry.get("modifiedTime"), str):
            try:
                modified = dt.datetime.fromisoformat(entry["modifiedTime"].replace("Z", "+00:00"))
            except ValueError:
                modified = None
        return DriveFile(
            id=str(entry.get("id", "")),
            name=name,
            owner=str(emails[0]),
            owner_name=str(owners[0].get("displayName") or ""),
            modified=_utc(modified) if modified and modified.tzinfo else None,
            md5=str(entry.get("md5Checksum") or "").lower(),
        )

    def find(self, rel: str, path: Path) -> tuple[DriveFile | None, str]:
        """The listed file a downloaded one is, else ``None`` and why.

        By name (Drive's zip adds `` (1)``, `` (2)`` to files of one name, in an order it does
        not say), narrowed by the content's md5 where the listing has ``md5Checksum``: a name
        several owners share, with nothing to tell them apart, is nobody's.
        """
        name = unicodedata.normalize("NFC", Path(rel).name)
        candidates = list(self.by_name.get(name, []))
        if (copy := _DRIVE_COPY.match(name)) is not None:
            original = copy.group("stem") + (copy.group("ext") or "")
            if len(self.by_name.get(original, [])) > 1:
                candidates += self.by_name[original]
        if not candidates:
            return None, (
                f"not in the Drive listing {self.path.name}: list the folder again after the "
                "download (or it is not that folder's)"
            )
        if any(c.md5 for c in candidates):
            digest = hashlib.md5(path.read_bytes()).hexdigest()
            same = [c for c in candidates if c.md5 == digest]
            if not same:
                return None, (
                    f"its content matches no file named {name!r} in the Drive listing "
                    f"{self.path.name} (changed since it was listed? list the folder again)"
                )
            candidates = same
        owners = sorted({c.owner.casefold() for c in candidates})
        if len(owners) > 1:
            return None, (
                f"ambiguous: the Drive listing has {len(candidates)} files named like {name!r}, "
                f"owned by {', '.join(owners)}, and Drive's zip renames them (' (1)', ' (2)') "
                "in an order it does not say: list with md5Checksum in fields (docs/grading.md)"
            )
        latest = [c for c in candidates if c.modified is not None]
        return (max(latest, key=lambda c: c.modified) if latest else candidates[0]), ""


def _identify_owner(
    item: Placed, rel: str, path: Path, listing: DriveListing, roster: Roster | None
) -> str | None:
    """Fill in whose ``item`` is from its Drive owner; return why it cannot be, or ``None``."""
    found, why = listing.find(rel, path)
    if found is None:
        kind = "ambiguous" if why.startswith("ambiguous") else "not listed"
        return item.skip(kind, why)
    item.lms_id = found.owner
    if found.modified is not None:
        item.submitted = found.modified.isoformat(timespec="seconds")
        item.time_source = "Drive listing"
    owner = f"{found.owner}" + (f" ({found.owner_name})" if found.owner_name else "")
    if roster is None:
        item.student = _slug(found.owner.split("@")[0])
        item.full_name, item.email = found.owner_name or found.owner, found.owner
        return None
    students = roster.by_account(found.owner)
    if len(students) > 1:
        ids = ", ".join(s.id for s in students)
        return item.skip("ambiguous", f"ambiguous: the Drive owner {owner} is the e-mail or "
                         f"lms_id of several roster students ({ids})")  # fmt: skip
    if not students:
        return item.skip(
            "unknown student",
            f"unknown student: owned in Drive by {owner}, who is not on the roster (add their "
            "Google account as email or lms_id; a teacher's account owns only files passed "
            "to them)",
        )
    _fill(item, students[0])
    item.lms_id = found.owner
    return None


# --------------------------------------------------------------------------------------
# Collecting
# --------------------------------------------------------------------------------------


@dataclass
class Placed:
    """One file of the archive and what became of it.

    Attributes:
        file: path inside the archive.
        action: ``placed``, ``replaced`` (a newer one than what ``COURSE`` held),
            ``unchanged`` (the same bytes were already there) or ``skipped``.
        reason: why it was skipped, or what an instructor should know about a placed one.
        student: the course's student id (empty when unknown).
        lms_id, full_name, email, prefix: what the LMS calls the student and the file's prefix.
        submitted: submission time, ISO 8601 in UTC (empty when unknown).
        time_source: ``file name``, ``archive entry`` or ``file mtime``.
        late: the LMS marked it late (Canvas).
        kind: what happened, in a few words (``placed``, ``not a notebook``, ``wrong lab``,
            ``unknown student``, ``ambiguous``, ``older attempt``, ``receipt``, ...): the
            report's and the exports' status for a student whose file was not graded.
    """

    file: str
    action: str = "skipped"
    reason: str = ""
    kind: str = ""
    student: str = ""
    lms_id: str = ""
    full_name: str = ""
    email: str = ""
    prefix: str = ""
    submitted: str = ""
    time_source: str = ""
    late: bool = False

    def skip(self, kind: str, reason: str) -> str:
        """Mark the file as not placed, for ``reason``; return the reason."""
        self.action, self.kind, self.reason = "skipped", kind, reason
        return reason


@dataclass
class CollectReport:
    """What ``collect`` did with every file of one archive."""

    lms: str
    lab: str
    archive: str
    files: list[Placed] = field(default_factory=list)
    record: Path | None = None

    @property
    def placed(self) -> list[Placed]:
        return [f for f in self.files if f.action in ("placed", "replaced", "unchanged")]

    @property
    def skipped(self) -> list[Placed]:
        """Files not placed (the LMS's own receipts are not submissions: not counted)."""
        return [f for f in self.files if f.action == "skipped"]

    def table(self) -> str:
        """One line per file: what happened and why."""
        lines = [f"{self.lms} archive {self.archive} -> lab {self.lab}"]
        for f in self.files:
            who = f"{f.student} ({f.full_name})" if f.student and f.full_name else f.student or "?"
            when = f" at {f.submitted}" if f.submitted and f.action != "skipped" else ""
            line = f"  {f.action:<9} {who:<24} {f.file}{when}"
            lines.append(line + (f"\n            {f.reason}" if f.reason else ""))
        receipts = sum(f.action == "receipt" for f in self.files)
        lines.append(
            f"{len(self.placed)} placed, {len(self.skipped)} not placed"
            + (f", {receipts} Blackboard receipt(s) read for nothing" if receipts else "")
        )
        return "\n".join(lines)


def _release_of(repo: Path, lab: str) -> Any:
    return read_notebook(repo / "labs" / lab / f"{lab}.ipynb")


def _grade_ids(notebook: Any) -> set[str]:
    return {
        str(cell.get("metadata", {}).get("nbgrader", {}).get("grade_id"))
        for cell in notebook.cells
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
    }


def _which_lab(path: Path, lab: str, releases: dict[str, Any]) -> tuple[str, str]:
    """(``ok``|``other``|``unknown``|``broken``, detail): which lab's notebook ``path`` is.

    By the nbgrader cell ids that survived (each lab's are its own: ``sinusoidal_encoding``,
    ``test_causal_mask``): the lab sharing most of them. Where none survived (Colab can lose
    them all), as the grader recognises a notebook: :func:`repair_notebook` matches the
    release's graded cells by content.
    """
    from transformer_lab.grading.repair import repair_notebook

    try:
        notebook = read_notebook(path)
    except Exception as exc:  # nbformat raises several kinds on broken JSON
        return "broken", f"{type(exc).__name__}: {str(exc)[:120]}"
    ids = _grade_ids(notebook)
    shared = {name: len(ids & _grade_ids(release)) for name, release in releases.items()}
    best = max(shared, key=lambda name: (shared[name], name == lab))
    if shared[best] > 0:
        return ("ok", "") if best == lab else ("other", best)
    # No cell id survived: the lab whose graded cells the grader's own matching finds most of.
    found = {}
    for name, release in releases.items():
        result = repair_notebook(notebook, release)
        found[name] = result.matched / max(result.expected, 1) if result.ok else 0.0
    best = max(found, key=lambda name: (found[name], name == lab))
    if found[best] == 0.0:
        return "unknown", ""
    return ("ok", "") if best == lab else ("other", best)


def _entry_times(archive: Path, zone: ZoneInfo) -> dict[str, dt.datetime]:
    """Path inside a zip -> its modification time (zip times carry no zone: read in ``zone``)."""
    if not zipfile.is_zipfile(archive):
        return {}
    with zipfile.ZipFile(archive) as zf:
        return {
            info.filename.rstrip("/"): dt.datetime(*info.date_time, tzinfo=zone)
            for info in zf.infolist()
        }


def _utc(moment: dt.datetime) -> dt.datetime:
    return moment.astimezone(dt.timezone.utc)


def read_timestamp(folder: Path) -> dt.datetime | None:
    """A submission folder's ``timestamp.txt`` (UTC), as nbgrader reads it; ``None`` if none."""
    from nbgrader.utils import parse_utc

    path = folder / TIMESTAMP
    if not path.is_file():
        return None
    try:
        return parse_utc(path.read_text().strip()).replace(tzinfo=dt.timezone.utc)
    except (ValueError, OverflowError):
        return None


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _identify(
    item: Placed,
    groups: dict[str, str],
    fmt: LmsFormat,
    roster: Roster | None,
    assignment: str = "",
) -> str | None:
    """Fill in who ``item`` belongs to from what the LMS wrote; return why not, or ``None``.

    Args:
        assignment: Blackboard only: the assignment name every entry of the download starts
            with (tells ``<assignment>_<user name>`` apart when both hold ``_``).
    """
    item.lms_id = groups.get("lms_id", "") or ""
    item.prefix = groups.get("prefix", "") or ""
    item.late = bool(groups.get("late"))
    if fmt.name == "blackboard":
        return _identify_blackboard(item, groups["outer"], roster, assignment)
    name = groups.get("student_id", "")
    if roster is None:
        item.student, item.full_name = _slug(name), name
        return None
    found, why = roster.match(lms_id=item.lms_id, names=(name,))
    if fmt.name == "classroom" and groups.get("other"):
        # "<title> - Student Name" is accepted too; a file naming two students is neither's.
        other, _ = roster.match(names=(groups["other"],))
        if found is not None and other is not None and other.id != found.id:
            ids = f"{found.id} and {other.id}"
            return item.skip("ambiguous", f"ambiguous: the name names two students ({ids})")
        found = found or other
    if found is None:
        kind = "ambiguous" if why.startswith("ambiguous") else "unknown student"
        return item.skip(kind, why)
    _fill(item, found)
    return None


def _fill(item: Placed, found: Student) -> None:
    item.student, item.full_name, item.email = found.id, found.full_name, found.email
    if not item.lms_id and found.lms_id:
        item.lms_id = found.lms_id


def _identify_blackboard(
    item: Placed, outer: str, roster: Roster | None, assignment: str
) -> str | None:
    """``<assignment>_<user name>``: the user name is the roster's ``lms_id`` (or id, e-mail)."""
    splits = [outer[i + 1 :] for i, c in enumerate(outer) if c == "_"]
    if not splits:
        return item.skip("misnamed", f"no user name in Blackboard's {outer!r}")
    shared = outer[len(assignment) + 1 :] if outer.startswith(assignment + "_") else ""
    if roster is None:
        user = shared or splits[-1]
        item.student, item.full_name, item.lms_id = _slug(user), user, user
        return None
    found: dict[str, tuple[Student, str]] = {}
    for user in splits:
        student, _ = roster.match(lms_id=user, names=(user,))
        if student is not None:
            found.setdefault(student.id, (student, user))
    if len(found) > 1:
        # Several readings name roster students: the one after the shared assignment name.
        found = {k: v for k, v in found.items() if v[1] == shared}
        if len(found) != 1:
            return item.skip(
                "ambiguous",
                f"ambiguous: Blackboard's {outer!r} could name several roster students: add "
                "their lms_id (Blackboard user name) to the roster",
            )
    if found:
        student, user = next(iter(found.values()))
        _fill(item, student)
        item.lms_id = user
        return None
    return item.skip(
        "unknown student",
        f"unknown student: no roster student has a user name in Blackboard's {outer!r} "
        "(add them, or their lms_id: the Blackboard user name)",
    )


def _blackboard_assignment(rels: list[str], fmt: LmsFormat) -> str:
    """The assignment name every Blackboard entry starts with (the longest shared ``..._``)."""
    if fmt.name != "blackboard":
        return ""
    outers = [m.group("outer") for r in rels if (m := re.match(fmt.named_regexp, r))]
    outers += [m.group("outer") for r in rels if (m := re.match(fmt.receipt, r))]
    if len(set(outers)) < 2:
        return ""
    common = os.path.commonprefix(outers)  # noqa: RUF071 (names, not paths)
    return common[: common.rfind("_")] if "_" in common else ""


def collect(
    source: Path,
    *,
    lms: str,
    lab: str,
    course: Path,
    repo: Path,
    roster: Roster | None = None,
    timezone: str = "UTC",
    drive_listing: Path | None = None,
) -> CollectReport:
    """Place an LMS's "download all submissions" into ``course/submitted/<student>/<lab>/``.

    Args:
        source: the downloaded archive (``.zip``) or the folder it was extracted into.
        lms: a key of :data:`FORMATS`.
        lab: the lab these submissions are for (name or prefix).
        course: the course folder (``submitted/`` is created there).
        repo: the repository whose ``labs/`` releases identify each notebook's lab.
        roster: maps the LMS's names and ids to course ids (without one, ids are made from
            the LMS's names and nobody is "unknown").
        timezone: zone of times without one (zip entry times, Blackboard's names).
        drive_listing: Google Classroom only: the Drive API's ``files.list`` answer for the
            assignment's folder (JSON): files are placed by their Drive owner's e-mail, not
            by their names.

    Returns:
        A :class:`CollectReport` listing every file of the archive and what became of it.

    Raises:
        GradingError: an unknown LMS, lab or zone, a source that is neither a folder nor a
            readable archive, a Drive listing for another LMS or one that cannot be read.
    """
    if lms not in FORMATS:
        raise GradingError(f"--lms {lms!r} is not one of {', '.join(FORMATS)}")
    fmt = FORMATS[lms]
    if drive_listing is not None and lms != "classroom":
        raise GradingError(f"--drive-listing {drive_listing} is for --lms classroom, not {lms}")
    listing = DriveListing.read(drive_listing) if drive_listing is not None else None
    (lab,) = select_labs(repo, [lab])
    try:
        zone = ZoneInfo(timezone)
    except Exception as exc:
        raise GradingError(f"--timezone {timezone!r} is not a time zone name") from exc
    source = Path(source).resolve()
    if not source.exists():
        raise GradingError(f"{source} does not exist: pass the LMS's download (zip or folder)")
    if source.is_file() and not zipfile.is_zipfile(source):
        raise GradingError(f"{source} is not a zip archive (nor a folder of submissions)")
    course = Path(course).resolve()
    releases = {name: _release_of(repo, name) for name in select_labs(repo, None)}
    report = CollectReport(lms, lab, str(source))
    with tempfile.TemporaryDirectory(prefix="tl-collect-") as tmp:
        extracted = Path(tmp) / "extracted"
        extracted.mkdir()
        if source.is_dir():
            archive_dir, times = source, {}
            extractor = LmsExtractor(zip_ext=[])  # a folder: copy everything, open nothing
        else:
            archive_dir = Path(tmp) / "archive"
            archive_dir.mkdir()
            (archive_dir / source.name).symlink_to(source)
            times = _entry_times(source, zone)
            extractor = LmsExtractor(zip_ext=[".zip"])
        try:
            extractor.extract(str(archive_dir), str(extracted))
        except Exception as exc:  # zipfile, shutil and setuptools (UnsafeMember) errors
            raise GradingError(f"could not extract {source}: {exc}") from exc
        collector = LmsCollector(named_regexp=fmt.named_regexp)
        # The extractor skips entries with absolute paths or "..": say so, never drop silently.
        for name in sorted(n for n in times if not (extracted / n).is_file()):
            if not name.endswith("/") and not (extracted / name).is_dir():
                reason = "an unsafe path (absolute or with ..) in the archive: not extracted"
                report.files.append(Placed(name, action="skipped", reason=reason, kind="unsafe"))
        for link in extractor.links:
            reason = "a symbolic link: not followed (hand in the file itself)"
            report.files.append(Placed(link, action="skipped", reason=reason, kind="link"))
        paths = sorted(p for p in extracted.rglob("*") if p.is_file() and not p.is_symlink())
        rels = [p.relative_to(extracted).as_posix() for p in paths]
        if listing is not None and listing.path.resolve().is_relative_to(source):
            # The listing saved inside the downloaded folder is the instructor's, not handed in.
            own = listing.path.resolve().relative_to(source).as_posix()
            kept = [(p, r) for p, r in zip(paths, rels, strict=True) if r != own]
            paths, rels = [p for p, _ in kept], [r for _, r in kept]
        assignment = _blackboard_assignment(rels, fmt)
        candidates: dict[str, list[tuple[Placed, Path, dt.datetime | None]]] = {}
        for path, rel in zip(paths, rels, strict=True):
            item = Placed(rel)
            report.files.append(item)
            when = _submission_time(rel, path, source, fmt, times, zone, item)
            if listing is not None:
                if _screen_owned(rel, path, listing, item, roster) is not None:
                    continue
                if item.time_source == "Drive listing":
                    when = dt.datetime.fromisoformat(item.submitted)
            elif _screen(rel, fmt, collector, item, roster, assignment) is not None:
                continue
            kind, detail = _which_lab(path, lab, releases)
            if kind == "other":
                item.skip("wrong lab", f"a notebook of lab {detail}, not of {lab}: collect it "
                          "with --lab")  # fmt: skip
                continue
            if kind == "broken":
                item.kind, item.reason = (
                    "unreadable",
                    f"placed, but not a readable notebook ({detail})",
                )
            elif kind == "unknown":
                item.kind = "unmatched"
                item.reason = "placed, but its graded cells match no lab's release"
            candidates.setdefault(item.student, []).append((item, path, when))
        for _student, found in candidates.items():
            why = (
                f"all are owned by {found[0][0].lms_id} in Drive, and Classroom hands in every "
                "attached file together"
                if listing is not None
                else ""
            )
            chosen = _choose(found, lab, by_name_only=fmt.name == "classroom", why=why)
            if chosen is not None:
                _place(course, lab, *chosen, report=report)
    report.record = _write_record(course, report)
    return report


def _submission_time(
    rel: str,
    path: Path,
    source: Path,
    fmt: LmsFormat,
    times: dict[str, dt.datetime],
    zone: ZoneInfo,
    item: Placed,
) -> dt.datetime | None:
    """When the file was handed in: from its name (Blackboard), its archive entry or its mtime."""
    found = re.match(fmt.named_regexp, rel)
    if found and fmt.time_format and found.groupdict().get("timestamp"):
        try:
            when = dt.datetime.strptime(found.group("timestamp"), fmt.time_format)
        except ValueError:
            return None
        moment, item.time_source = when.replace(tzinfo=zone), "file name"
    elif rel in times:
        moment, item.time_source = times[rel], "archive entry"
    elif source.is_dir():
        stamp = (source / rel).stat().st_mtime
        moment, item.time_source = dt.datetime.fromtimestamp(stamp, dt.timezone.utc), "file mtime"
    else:
        return None
    item.submitted = _utc(moment).isoformat(timespec="seconds")
    return _utc(moment)


def _screen(
    rel: str,
    fmt: LmsFormat,
    collector: LmsCollector,
    item: Placed,
    roster: Roster | None,
    assignment: str = "",
) -> str | None:
    """Why the file at ``rel`` cannot be placed (``None``: it can, and ``item`` knows whose)."""
    name = Path(rel).name
    if fmt.receipt and re.match(fmt.receipt, rel):
        item.action, item.kind = "receipt", "receipt"
        item.reason = "Blackboard's submission receipt: read for nothing, not a submission"
        return item.reason
    groups = collector.collect(rel)
    if groups is not None:
        reason = _identify(item, groups, fmt, roster, assignment)
        if reason is not None:
            return reason
    if name.lower().endswith(ARCHIVE_EXTS):
        return item.skip(
            "archive", "an archive inside the archive: not opened; ask the student for the notebook"
        )
    if groups is None:
        return item.skip(
            "misnamed",
            f"the name does not follow {fmt.name}'s download naming (e.g. {fmt.example!r})",
        )
    if not name.lower().endswith(".ipynb"):
        suffix = Path(name).suffix or "no extension"
        return item.skip("not a notebook", f"not a notebook ({suffix}): only .ipynb is graded")
    return None


def _screen_owned(
    rel: str, path: Path, listing: DriveListing, item: Placed, roster: Roster | None
) -> str | None:
    """As :func:`_screen`, for a Classroom download with Drive's listing: the owner decides."""
    reason = _identify_owner(item, rel, path, listing, roster)
    if reason is not None:
        return reason
    name = Path(rel).name
    if name.lower().endswith(ARCHIVE_EXTS):
        return item.skip(
            "archive", "an archive inside the archive: not opened; ask the student for the notebook"
        )
    if not name.lower().endswith(".ipynb"):
        suffix = Path(name).suffix or "no extension"
        return item.skip("not a notebook", f"not a notebook ({suffix}): only .ipynb is graded")
    return None


def _choose(
    found: list[tuple[Placed, Path, dt.datetime | None]],
    lab: str,
    *,
    by_name_only: bool = False,
    why: str = "",
) -> tuple[Placed, Path, dt.datetime | None] | None:
    """One student's notebook to place: the newest, as ``zip_collect`` keeps the newest.

    Without distinct times (two files handed in together) nothing is placed: the grader
    cannot know which one the student meant. Where the LMS names files by nothing but a name
    anyone can type (``by_name_only``: Google Classroom), two files naming one student are
    both left out: either may be another student's upload named after them; with Drive's
    owners (``why`` says so), two files of one owner are still two attachments handed in
    together.
    """
    if len(found) == 1:
        return found[0]
    names = ", ".join(item.file for item, _, _ in found)
    times = [when for _, _, when in found]
    if by_name_only or None in times or len(set(times)) < len(times):
        why = why or (
            "the download does not say who uploaded which"
            if by_name_only
            else "no submission times to choose by"
        )
        count = "two" if len(found) == 2 else str(len(found))
        for item, _, _ in found:
            item.skip(
                "ambiguous",
                f"ambiguous: {count} notebooks for {lab} from one student ({names}) and {why}: "
                "none placed; keep one and collect again",
            )
        return None
    ordered = sorted(found, key=lambda one: one[2])
    newest = ordered[-1]
    for item, _, when in ordered[:-1]:
        item.skip(
            "older attempt",
            f"an older attempt ({when.isoformat()}): the newest ({newest[0].file}) was placed, "
            "as nbgrader's zip_collect keeps the newest",
        )
    return newest


def _place(
    course: Path,
    lab: str,
    item: Placed,
    path: Path,
    when: dt.datetime | None,
    *,
    report: CollectReport,
) -> None:
    """Copy one notebook to ``submitted/<student>/<lab>/<lab>.ipynb`` with its time."""
    folder = course / "submitted" / item.student / lab
    target = folder / f"{lab}.ipynb"
    existing = sorted(folder.glob("*.ipynb")) if folder.is_dir() else []
    if existing:
        if any(_sha(p) == _sha(path) for p in existing):
            item.action, item.kind = "unchanged", item.kind or "placed"
            item.reason = (item.reason + "; " if item.reason else "") + "already collected"
            return
        before = read_timestamp(folder)
        if when is None or before is None or when <= before:
            item.reason = (
                f"{folder} already holds a submission"
                + (f" from {before.isoformat()}" if before else " (no time recorded)")
                + (f" and this one is from {when.isoformat()}" if when else "")
                + ": kept the one there (nbgrader keeps the newest); move it away to replace it"
            )
            item.action, item.kind = "skipped", "kept existing"
            return
        stamp = before.strftime("%Y%m%dT%H%M%SZ")
        aside = course / LMS_DIR / "superseded" / item.student / lab / stamp
        aside.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():
            if old.is_file():
                shutil.move(str(old), aside / old.name)
        item.action, item.kind = "replaced", item.kind or "placed"
        item.reason = (
            item.reason + "; " if item.reason else ""
        ) + f"the older one moved to {aside}"
    else:
        item.action, item.kind = "placed", item.kind or "placed"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, target)
    if when is not None:
        # zip_collect's format (``datetime.isoformat(' ')``), read by nbgrader's parse_utc.
        (folder / TIMESTAMP).write_text(when.replace(tzinfo=None).isoformat(" ") + "\n")
        os.utime(target, (when.timestamp(), when.timestamp()))


def _write_record(course: Path, report: CollectReport) -> Path:
    """Merge what was placed into ``COURSE/lms/<lms>-<lab>.json`` (earlier collections kept)."""
    path = course / LMS_DIR / f"{report.lms}-{report.lab}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(path.read_text()) if path.is_file() else {}
    students = dict(old.get("students", {}))
    for item in report.files:
        if item.action in ("placed", "replaced"):
            students[item.student] = asdict(item)
        elif item.action == "unchanged":
            students.setdefault(item.student, asdict(item))
    runs = list(old.get("runs", []))
    runs.append(
        {
            "archive": report.archive,
            "at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "files": [asdict(f) for f in report.files],
        }
    )
    write_json(path, {"lms": report.lms, "lab": report.lab, "students": students, "runs": runs})
    return path


def lms_record(course: Path, lms: str, lab: str) -> dict[str, dict[str, Any]]:
    """Student -> what the LMS called them and their file, from earlier ``collect`` runs."""
    path = Path(course) / LMS_DIR / f"{lms}-{lab}.json"
    if not path.is_file():
        return {}
    return dict(json.loads(path.read_text()).get("students", {}))


def save_roster(course: Path, roster_csv: Path) -> Path:
    """Keep the roster as ``COURSE/lms/roster.csv``: grading, the report and the exports then
    list every enrolled student, also those who handed in nothing."""
    target = Path(course).resolve() / LMS_DIR / ROSTER
    target.parent.mkdir(parents=True, exist_ok=True)
    if Path(roster_csv).resolve() != target.resolve():
        shutil.copyfile(roster_csv, target)
    return target


def course_roster(course: Path, roster: Roster | None = None) -> Roster | None:
    """``roster`` if given, else the one ``collect --roster`` kept in the course, else ``None``."""
    if roster is not None:
        return roster
    path = Path(course) / LMS_DIR / ROSTER
    return Roster.read(path) if path.is_file() else None


def collected_files(course: Path) -> list[dict[str, Any]]:
    """Every file of the latest collection of each archive, with its ``lms`` and ``lab``.

    What ``collect`` did with each (``action``, ``kind``, ``reason``, ``student``): the
    report, ``grades.csv`` and the exports show the files that were not placed from it.
    """
    files: list[dict[str, Any]] = []
    for path in sorted((Path(course) / LMS_DIR).glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        latest: dict[str, dict[str, Any]] = {}
        for run in data.get("runs", []):
            latest[str(run.get("archive"))] = run
        for run in latest.values():
            for item in run.get("files", []):
                files.append({**item, "lms": data.get("lms", ""), "lab": data.get("lab", "")})
    return files
