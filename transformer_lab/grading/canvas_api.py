"""``labs export --lms canvas-api``: each student's feedback page as a Canvas comment file.

Canvas's "Re-upload submissions" (the ``canvas`` export's feedback zip) names an attached page
after the submitted file (``01_positional_encoding.ipynb``), so the student receives an HTML
page under a notebook's name. Canvas's REST API keeps the name it is given: per student and
lab, this module sends the feedback page as a submission-comment file. It talks to Canvas
through ``canvasapi`` (UCF Open's maintained client, on ``requests``; the ``lms`` extra):

1. ``Canvas(url, token).get_course(course).get_assignment(assignment)`` (once per run and
   lab), then ``get_submission(user)``: ``GET .../submissions/:user``;
2. canvasapi's ``Uploader`` (the upload ``Submission.upload_comment`` runs), Canvas's
   documented flow (``doc/api/file_uploads.md``): ``POST .../submissions/:user/comments/files``
   (name, size, ``text/html``), the page to the ``upload_url`` Canvas answers
   (``upload_params`` unchanged, the file last, *without* the token), the confirmation: the
   file's id;
3. ``Submission.edit``: ``PUT .../submissions/:user`` with ``comment[text_comment]`` (score
   and the checks that failed, in plain text), ``comment[file_ids][]`` and, with
   ``--canvas-grades``, ``submission[posted_grade]``: one comment holding text and page.
   (``upload_comment`` itself would attach the file to a comment of its own, text-less, and
   the text would be a second comment: the upload is run here without that comment.)

What it guarantees:

* the token is read from an environment variable (``CANVAS_API_TOKEN`` by default), never from
  the command line, and is never written anywhere (not in errors, the plan or the journal); it
  goes only to the ``--canvas-url`` host (canvasapi sends it to its base URL only, never
  with the upload; ``requests`` drops it on a redirect to another host), and never over plain
  ``http`` except to this machine;
* a journal (``COURSE/lms/canvas-api-journal.json``) records each step as it completes: a
  re-run sends nothing for a student already done (a student whose page, comment or grade
  changed since is sent again), and a file uploaded before a failure is not uploaded twice;
* a failure for one student (a 403, 404 or 500) is one line naming the student, the request
  and what Canvas said, and the others go on; a 401 (the token is refused) or no connection
  to Canvas stops the run at once, with one line, since every further request would fail so
  (canvasapi's ``InvalidAccessToken``; its ``Unauthorized``, a 401 for one action, is the
  student's line);
* ``--dry-run`` writes the plan (``OUT/canvas-api-plan.json``: per student, the requests, the
  comment's text, the file's name and size, the grade) and sends nothing.

Only submissions whose points count (graded, incomplete, crashed) are sent; flagged, failed,
unmatched and missing ones are left for an instructor (named in ``left out:`` lines).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import shutil
import tempfile
import urllib.parse
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformer_lab.grading.course import GradingError, write_json
from transformer_lab.grading.export import ExportReport, _points, grade_value
from transformer_lab.grading.lms import LMS_DIR, Roster, course_roster, lms_record
from transformer_lab.grading.results import GRADED, Outcome, course_outcomes

__all__ = [
    "JOURNAL",
    "PLAN",
    "TOKEN_ENV",
    "CanvasTarget",
    "comment_text",
    "push_feedback",
]

TOKEN_ENV = "CANVAS_API_TOKEN"
JOURNAL = "canvas-api-journal.json"
PLAN = "canvas-api-plan.json"


@dataclass(frozen=True)
class CanvasTarget:
    """Where feedback goes: a Canvas instance, one of its courses, an assignment per lab.

    Attributes:
        base_url: ``https://canvas.example.edu`` (no ``/api/v1``).
        course_id: the course's id (the number in ``/courses/<id>``).
        assignments: lab -> the lab's assignment id (the number in ``/assignments/<id>``).
        grades: also post each grade (``submission[posted_grade]``).
    """

    base_url: str
    course_id: str
    assignments: dict[str, str]
    grades: bool = False

    def check(self) -> None:
        """Refuse a URL or id that cannot be right, naming it.

        Raises:
            GradingError: not an ``http(s)://host`` URL, ``http`` to another machine (the
                token would travel in clear), a course id that is not a number.
        """
        parts = urllib.parse.urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise GradingError(
                f"--canvas-url {self.base_url!r} is not an http(s) URL (e.g. "
                "https://canvas.example.edu)"
            )
        if parts.scheme == "http" and not _loopback(parts.hostname):
            raise GradingError(
                f"--canvas-url {self.base_url!r} is plain http: the token would travel "
                "unencrypted; use https"
            )
        if parts.query or parts.fragment:
            raise GradingError(f"--canvas-url {self.base_url!r} has a query or fragment")
        if not str(self.course_id).isdigit():
            raise GradingError(f"--canvas-course {self.course_id!r} is not a Canvas course id")

    @property
    def root(self) -> str:
        return self.base_url.rstrip("/")

    def submission(self, lab: str, user: str) -> str:
        """The API path of one student's submission of ``lab``."""
        return (
            f"/api/v1/courses/{self.course_id}/assignments/{self.assignments[lab]}"
            f"/submissions/{user}"
        )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# --------------------------------------------------------------------------------------
# What is sent
# --------------------------------------------------------------------------------------


def failed_checks(outcome: Outcome) -> list[str]:
    """The checks that lost points, each with the mistake the grader recognised."""
    failed = []
    for gid, cell in sorted(outcome.cells.items()):
        if float(cell.get("score") or 0.0) < float(cell.get("max_score") or 0.0):
            mistake = cell.get("mistake")
            failed.append(f"{gid} ({mistake})" if mistake else gid)
    return failed


def comment_text(outcome: Outcome, page_name: str) -> str:
    """The comment's plain text: points, the checks that failed, where the details are."""
    auto = outcome.score - outcome.manual_score
    lines = [
        f"{outcome.lab}: {_points(outcome.score)}/{_points(outcome.max_score)} points "
        f"(checks {_points(auto)}, written answers {_points(outcome.manual_score)}/"
        f"{_points(outcome.manual_max)}). Status: {outcome.label}."
    ]
    if outcome.late_penalty:
        lines.append(f"Late penalty: {_points(outcome.late_penalty)}.")
    failed = failed_checks(outcome)
    lines.append(
        "Checks that failed: " + "; ".join(failed) + "." if failed else "Every check passed."
    )
    lines.append(f"Details in the attached feedback page, {page_name} (open it in a browser).")
    return "\n".join(lines)


@dataclass
class Item:
    """One student's feedback for one lab, as it will be sent."""

    student: str
    name: str
    lab: str
    user_id: str
    page: Path
    page_name: str
    text: str
    grade: str

    def key(self, target: CanvasTarget) -> str:
        """The journal's key: the lab's assignment and the student."""
        number = target.assignments[self.lab]
        return f"assignment {number}|{self.lab}|{self.student}|user {self.user_id}"

    def digest(self) -> str:
        """What was sent: the page's bytes, the comment and the grade (changed: send again)."""
        h = hashlib.sha256(self.page.read_bytes())
        h.update(b"\0" + self.text.encode() + b"\0" + self.grade.encode())
        return h.hexdigest()


def _items(
    course: Path,
    outcomes: list[Outcome],
    target: CanvasTarget,
    roster: Roster | None,
    report: ExportReport,
) -> list[Item]:
    """What to send, per student and lab; a ``left out:`` line for each one not sent."""
    items = []
    for o in outcomes:
        if o.lab not in target.assignments:
            continue
        user = _user_id(course, o, roster)
        if not user:
            report.no_id("canvas", o, "Canvas user id")
        elif o.status not in GRADED:
            report.left_out.append(
                f"canvas-api {o.lab}: {o.student} not sent: {o.label} (an instructor reviews it)"
            )
        elif o.feedback is None or not o.feedback.is_file():
            report.left_out.append(f"canvas-api {o.lab}: {o.student} has no feedback page")
        else:
            page_name = f"{o.lab}_feedback.html"
            grade = grade_value(o) if target.grades else ""
            text = comment_text(o, page_name)
            items.append(Item(o.student, o.name, o.lab, user, o.feedback, page_name, text, grade))
    return items


def _user_id(course: Path, outcome: Outcome, roster: Roster | None) -> str:
    """The student's Canvas user id: collect's record, else the roster's ``lms_id``."""
    record = lms_record(course, "canvas", outcome.lab).get(outcome.student, {})
    if record.get("lms_id"):
        return str(record["lms_id"])
    if roster is not None:
        for s in roster.students:
            if s.id == outcome.student:
                return s.lms_id
    return ""


def _plan_entry(item: Item, target: CanvasTarget, state: str) -> dict[str, Any]:
    path = target.submission(item.lab, item.user_id)
    put: dict[str, Any] = {
        "comment[text_comment]": item.text,
        "comment[file_ids][]": "<the id of the uploaded file>",
    }
    if item.grade:
        put["submission[posted_grade]"] = item.grade
    return {
        "student": item.student,
        "name": item.name,
        "lab": item.lab,
        "canvas_user_id": item.user_id,
        "assignment_id": target.assignments[item.lab],
        "state": state,
        "file": {
            "name": item.page_name,
            "source": str(item.page),
            "size": item.page.stat().st_size,
            "content_type": "text/html",
        },
        "text_comment": item.text,
        "posted_grade": item.grade or None,
        "requests": [
            {"method": "GET", "url": target.root + path},
            {"method": "POST", "url": target.root + path + "/comments/files",
             "form": {"name": item.page_name, "size": item.page.stat().st_size,
                      "content_type": "text/html"}},
            {"method": "POST", "url": "<upload_url>", "form": "<upload_params>, then file"},
            {"method": "PUT", "url": target.root + path, "form": put},
        ],
    }  # fmt: skip


# --------------------------------------------------------------------------------------
# Canvas, through canvasapi
# --------------------------------------------------------------------------------------

NO_CANVASAPI = (
    "labs export --lms canvas-api needs canvasapi: pip install 'transformer-lab[lms]' "
    "(or pip install 'canvasapi>=3.0')"
)


class CanvasError(Exception):
    """A request that failed; ``fatal``: every further request would fail the same way."""

    def __init__(self, message: str, *, fatal: bool = False) -> None:
        super().__init__(message)
        self.fatal = fatal


def _canvasapi() -> Any:
    """The ``canvasapi`` package, or the ``pip install`` that brings it, in one line."""
    try:
        import canvasapi
        import canvasapi.upload  # the upload flow, run without upload_comment's own comment
    except ImportError as exc:
        raise GradingError(NO_CANVASAPI) from exc
    return canvasapi


@dataclass
class _Canvas:
    """canvasapi's view of one Canvas: the course fetched once, each lab's assignment once.

    Every call goes through :meth:`ask`, which turns canvasapi's and requests' exceptions into
    one :class:`CanvasError` line naming the student, the request and what Canvas said.
    """

    target: CanvasTarget
    api: Any  # canvasapi.Canvas
    token_env: str = TOKEN_ENV
    who: str = ""
    course: Any = None
    assignments: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def connect(cls, target: CanvasTarget, token: str, token_env: str) -> _Canvas:
        canvasapi = _canvasapi()
        with warnings.catch_warnings():  # plain http: CanvasTarget.check allowed loopback only
            warnings.simplefilter("ignore", UserWarning)
            return cls(target, canvasapi.Canvas(target.root, token), token_env)

    def submission(self, item: Item) -> Any:
        """``get_course(...).get_assignment(...).get_submission(user)`` (course, lab cached)."""
        t, api = self.target, self.target.root + "/api/v1"
        if not item.user_id.isdigit():
            raise CanvasError(f"{self.who}: Canvas user id {item.user_id!r} is not a number")
        if self.course is None:
            what = f"GET {api}/courses/{t.course_id}"
            self.course = self.ask(what, lambda: self.api.get_course(int(t.course_id)))
        number = t.assignments[item.lab]
        if item.lab not in self.assignments:
            what = f"GET {api}/courses/{t.course_id}/assignments/{number}"
            found = self.ask(what, lambda: self.course.get_assignment(int(number)))
            self.assignments[item.lab] = found
        what = f"GET {t.root}{t.submission(item.lab, item.user_id)}"
        return self.ask(what, lambda: self.assignments[item.lab].get_submission(int(item.user_id)))

    def upload(self, submission: Any, item: Item) -> int:
        """Canvas's 3-step comment-file upload (canvasapi's ``Uploader``); the file's id.

        ``Submission.upload_comment`` runs this same ``Uploader`` and then PUTs a comment
        holding the file alone; the file is uploaded here without that comment, so that one
        PUT (:func:`_send`) attaches it to the comment with the text and grade. The page is
        copied under the name Canvas is to show (the uploader sends the file's own name).
        """
        canvasapi = _canvasapi()
        path = self.target.submission(item.lab, item.user_id)
        what = f"POST {self.target.root}{path}/comments/files (then the page to its upload_url)"
        with tempfile.TemporaryDirectory(prefix="canvas-api-") as tmp:
            copy = Path(tmp) / item.page_name
            shutil.copyfile(item.page, copy)
            uploader = canvasapi.upload.Uploader(
                submission._requester,  # the submission's own (its course, token, host)
                path.removeprefix("/api/v1/") + "/comments/files",
                str(copy),
                content_type="text/html",
            )
            ok, answer = self.ask(what, uploader.start)
        if not ok or not isinstance(answer, dict) or answer.get("id") is None:
            raise CanvasError(f"{self.who}: Canvas's answer to {what} names no file{_said(answer)}")
        return int(answer["id"])

    def ask(self, what: str, call: Callable[[], Any]) -> Any:
        """``call()``; a failure becomes one :class:`CanvasError` line (fatal: stop the run)."""
        canvasapi = _canvasapi()
        import requests

        try:
            return call()
        except canvasapi.exceptions.CanvasException as exc:
            raise self._refused(exc, what) from None
        except requests.ConnectionError as exc:
            url = exc.request.url if exc.request is not None else self.target.root
            raise CanvasError(
                f"{self.who}: could not reach {_host(url)} ({what}): {_reason(exc)}",
                fatal=_host(url) == _host(self.target.root),  # Canvas itself: so for everyone
            ) from None
        except (requests.RequestException, ValueError) as exc:  # e.g. an answer not JSON
            # a ValueError's words are canvasapi's or the JSON parser's (no URL, no query)
            why = str(exc)[:200] if isinstance(exc, ValueError) else type(exc).__name__
            raise CanvasError(f"{self.who}: {what} failed: {why}") from None

    def _refused(self, exc: Exception, what: str) -> CanvasError:
        """What Canvas's refusal means, with its own words; a token refused is fatal."""
        errors = _canvasapi().exceptions
        said = _said(getattr(exc, "message", ""))
        if isinstance(exc, errors.InvalidAccessToken):
            return CanvasError(
                f"{self.who}: Canvas answered 401 Unauthorized to {what}: the token in "
                f"${self.token_env} is not accepted (expired, revoked or "
                f"of another Canvas){said}; stopped, nothing more sent",
                fatal=True,
            )
        course = self.target.course_id
        meanings = (
            (errors.Unauthorized, "401", "the token's user may not do this for this student "
             f"(in course {course}: a teacher's token, or a TA's whose sections include them)"),
            (errors.RateLimitExceeded, "429", "too many requests: run the command again later"),
            (errors.Forbidden, "403", "the token's user may not do this in course "
             f"{course} (a teacher's or TA's token is needed)"),
            (errors.ResourceDoesNotExist, "404", f"no such course, assignment or student (course "
             f"{course}: check --canvas-course, --canvas-assignment and the student's Canvas "
             "user id)"),
        )  # fmt: skip
        status, meaning = next(
            ((status, meaning) for kind, status, meaning in meanings if isinstance(exc, kind)),
            ("an error", "Canvas failed"),  # a 500, or another status canvasapi raises
        )
        return CanvasError(f"{self.who}: Canvas answered {status} to {what}: {meaning}{said}")


def _said(message: Any) -> str:
    """Canvas's own words (``{"errors": [{"message": ...}]}``, or canvasapi's), shortened."""
    if isinstance(message, str):
        try:
            message = json.loads(message)
        except ValueError:
            text = " ".join(message.split())
            return f" (Canvas: {text[:200]})" if text and not text.startswith("<") else ""
    if isinstance(message, dict):
        message = message.get("errors") or message.get("message") or ""
    if isinstance(message, list) and message and isinstance(message[0], dict):
        message = message[0].get("message", "")
    return f" (Canvas: {str(message)[:200]})" if message else ""


def _reason(exc: Exception) -> str:
    """Why a connection failed (``[Errno 111] Connection refused``), without the URL's query."""
    found = re.search(r"\[Errno -?\d+\][^'\")]*", str(exc))
    return found.group(0).strip() if found else type(exc).__name__


def _host(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _send(canvas: _Canvas, item: Item, journal: dict[str, Any], save: Any) -> dict[str, Any]:
    """Upload (unless the journal has the file) and attach it with the comment and grade.

    One ``Submission.edit`` (``PUT .../submissions/:user``) makes one comment holding the text
    and the file (``comment[text_comment]``, ``comment[file_ids][]``) and, with
    ``--canvas-grades``, posts the grade (``submission[posted_grade]``).
    """
    entry = journal.setdefault(item.key(canvas.target), {})
    digest = item.digest()
    if entry.get("digest") != digest:
        entry.clear()
        entry["digest"] = digest
    submission = canvas.submission(item)
    if entry.get("file_id") is None:
        entry["file_id"] = canvas.upload(submission, item)
        save()
    comment = {"text_comment": item.text, "file_ids": [entry["file_id"]]}
    grade = {"submission": {"posted_grade": item.grade}} if item.grade else {}
    what = f"PUT {canvas.target.root}{canvas.target.submission(item.lab, item.user_id)}"
    canvas.ask(what, lambda: submission.edit(comment=comment, **grade))
    entry["state"] = "done"
    save()
    return entry


# --------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------


def _read_journal(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise GradingError(f"{path} is not valid JSON ({exc}): move it away to send again") from exc
    return data if isinstance(data, dict) else {}


def push_feedback(
    course: Path,
    out: Path,
    target: CanvasTarget,
    *,
    labs: list[str] | None = None,
    roster: Roster | None = None,
    dry_run: bool = False,
    token_env: str = TOKEN_ENV,
    deadlines: dict[str, Any] | None = None,
) -> tuple[ExportReport, list[str]]:
    """Send (or with ``dry_run`` plan) every student's feedback page as a Canvas comment file.

    Args:
        course: the graded course folder.
        out: where the plan (``canvas-api-plan.json``) is written.
        target: the Canvas instance, course and per-lab assignments.
        labs: only these labs (default: every lab with an assignment id in ``target``).
        roster: the roster (default: the one ``collect`` kept).
        dry_run: write the plan, send nothing (no token needed).
        token_env: the environment variable holding the API token.
        deadlines: lab -> deadline (late marks in the comment's status).

    Returns:
        The report (files written, students left out) and one line per student: ``sent``,
        ``already sent``, ``would send`` or ``FAILED`` with why.

    Raises:
        GradingError: a bad URL or id, no assignment id for a lab, no token (unless
            ``dry_run``), an unreadable journal.
    """
    target.check()
    course, out = Path(course).resolve(), Path(out).resolve()
    for lab, number in target.assignments.items():
        if not str(number).isdigit():
            raise GradingError(f"--canvas-assignment {lab}={number!r}: not a Canvas assignment id")
    chosen = [lab for lab in (labs or sorted(target.assignments))]
    missing = [lab for lab in chosen if lab not in target.assignments]
    if missing or not chosen:
        raise GradingError(
            f"no Canvas assignment id for {', '.join(missing) or 'any lab'}: give "
            "--canvas-assignment LAB=ID for each lab to send"
        )
    token = os.environ.get(token_env, "").strip()
    if not dry_run and not token:
        raise GradingError(
            f"${token_env} is empty: put a Canvas API token there (Account > Settings > New "
            "access token); it is never read from the command line"
        )
    canvas = None if dry_run else _Canvas.connect(target, token, token_env)
    roster = course_roster(course, roster)
    outcomes = course_outcomes(course, chosen, deadlines, roster=roster)
    report = ExportReport()
    items = _items(course, outcomes, target, roster, report)
    journal_path = course / LMS_DIR / JOURNAL
    everything = _read_journal(journal_path)
    scope = f"{target.root}|course {target.course_id}"
    journal = everything.setdefault(scope, {})
    lines: list[str] = []
    plan = []
    for item in items:
        done = journal.get(item.key(target), {})
        sent = done.get("state") == "done" and done.get("digest") == item.digest()
        plan.append(_plan_entry(item, target, "already sent" if sent else "to send"))
    out.mkdir(parents=True, exist_ok=True)
    api = f"{target.root}/api/v1/courses/{target.course_id}"
    first = [{"method": "GET", "url": api}]  # once per run, and each lab's assignment once:
    first += [{"method": "GET", "url": f"{api}/assignments/{target.assignments[lab]}"}
              for lab in chosen]  # fmt: skip
    write_json(out / PLAN, {"canvas": target.root, "course_id": target.course_id,
                             "dry_run": dry_run, "first": first, "comments": plan})  # fmt: skip
    report.written.append(out / PLAN)
    stopped = ""
    for item, entry in zip(items, plan, strict=True):
        label = f"{item.student} {item.lab} (Canvas user {item.user_id})"
        if entry["state"] == "already sent":
            lines.append(f"already sent  {label}")
        elif dry_run:
            lines.append(f"would send    {label}: {item.page_name}, grade {item.grade or '-'}")
        elif stopped:
            lines.append(f"not sent      {label}: stopped ({stopped})")
        else:
            canvas.who = label
            try:
                done = _send(canvas, item, journal, lambda: write_json(journal_path, everything))
            except CanvasError as exc:
                lines.append(f"FAILED        {exc}")
                if exc.fatal:
                    stopped = "an earlier request failed for every student alike"
                continue
            lines.append(f"sent          {label}: file {done['file_id']} {item.page_name}"
                         + (f", grade {item.grade}" if item.grade else ""))  # fmt: skip
    return report, lines
