"""``labs export --lms canvas-api``: each student's feedback page as a Canvas comment file.

Canvas's "Re-upload submissions" (the ``canvas`` export's feedback zip) names an attached page
after the submitted file (``01_positional_encoding.ipynb``), so the student receives an HTML
page under a notebook's name. Canvas's REST API keeps the name it is given: per student and
lab, this module sends the feedback page as a submission-comment file, through Canvas's
documented upload flow (``doc/api/file_uploads.md``, "Uploading via POST"):

1. ``POST /api/v1/courses/:course/assignments/:assignment/submissions/:user/comments/files``
   with ``name``, ``size``, ``content_type``: Canvas answers ``upload_url`` and
   ``upload_params``;
2. ``POST upload_url``, multipart, every ``upload_params`` field unchanged and then ``file``
   last, *without* the token (the URL may be another host: S3, inst-fs);
3. the upload's answer: a 3xx (GET its ``Location`` with the token to complete the upload), a
   201 with ``Location`` (GET it for the file), or the file's JSON itself: its ``id``;
4. ``PUT /api/v1/courses/:course/assignments/:assignment/submissions/:user`` with
   ``comment[text_comment]`` (score and the checks that failed, in plain text),
   ``comment[file_ids][]`` and, with ``--canvas-grades``, ``submission[posted_grade]``.

What it guarantees:

* the token is read from an environment variable (``CANVAS_API_TOKEN`` by default), never from
  the command line, and is never written anywhere (not in errors, the plan or the journal); it
  goes only to the ``--canvas-url`` host, and never over plain ``http`` except to this machine;
* a journal (``COURSE/lms/canvas-api-journal.json``) records each step as it completes: a
  re-run sends nothing for a student already done (a student whose page, comment or grade
  changed since is sent again), and a file uploaded before a failure is not uploaded twice;
* a failure for one student (a 403, 404 or 500) is one line naming the student, the request
  and what Canvas said, and the others go on; a 401 (the token is refused) or no connection
  to Canvas stops the run at once, with one line, since every further request would fail so;
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
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformer_lab.grading.course import GradingError
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
TIMEOUT_S = 60.0


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
            {"method": "POST", "url": target.root + path + "/comments/files",
             "form": {"name": item.page_name, "size": item.page.stat().st_size,
                      "content_type": "text/html"}},
            {"method": "POST", "url": "<upload_url>", "form": "<upload_params>, then file"},
            {"method": "PUT", "url": target.root + path, "form": put},
        ],
    }  # fmt: skip


# --------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------


class CanvasError(Exception):
    """A request that failed; ``fatal``: every further request would fail the same way."""

    def __init__(self, message: str, *, fatal: bool = False) -> None:
        super().__init__(message)
        self.fatal = fatal


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are Canvas's upload confirmations: handled by hand, with or without token."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


@dataclass
class _Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body.decode("utf-8") or "null")
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None


@dataclass
class _Client:
    """Requests to one Canvas: the token only to its host, every failure in one sentence."""

    target: CanvasTarget
    token: str
    token_env: str = TOKEN_ENV
    who: str = ""

    def call(
        self,
        method: str,
        url: str,
        *,
        form: list[tuple[str, str]] | None = None,
        body: bytes | None = None,
        content_type: str = "",
        auth: bool = True,
    ) -> _Response:
        """One request; 2xx and 3xx are answers, anything else a :class:`CanvasError`."""
        if url.startswith("/"):
            url = self.target.root + url
        headers = {"Accept": "application/json"}
        if auth:
            if urllib.parse.urlsplit(url).netloc != urllib.parse.urlsplit(self.target.root).netloc:
                raise CanvasError(
                    f"{self.who}: Canvas sent us to {_short(url)}, not {self.target.root}: "
                    "the token is sent only to --canvas-url; nothing sent there"
                )
            headers["Authorization"] = f"Bearer {self.token}"
        if form is not None:
            body = urllib.parse.urlencode(form).encode()
            content_type = "application/x-www-form-urlencoded"
        if content_type:
            headers["Content-Type"] = content_type
        request = urllib.request.Request(url, data=body, headers=headers, method=method)
        what = f"{method} {_short(url)}"
        try:
            with _OPENER.open(request, timeout=TIMEOUT_S) as answer:
                return _Response(answer.status, dict(answer.headers.items()), answer.read())
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:
                return _Response(exc.code, dict(exc.headers.items()), exc.read())
            raise self._http_error(exc, what) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CanvasError(
                f"{self.who}: could not reach {_host(url)} ({what}): {reason}",
                fatal=auth,  # Canvas itself unreachable: so for everyone
            ) from None

    def _http_error(self, exc: urllib.error.HTTPError, what: str) -> CanvasError:
        said = _canvas_message(exc)
        if exc.code == 401:
            return CanvasError(
                f"{self.who}: Canvas answered 401 Unauthorized to {what}: the token in "
                f"${self.token_env} is not accepted (expired, revoked or "
                f"of another Canvas){said}; stopped, nothing more sent",
                fatal=True,
            )
        meaning = {
            403: "the token's user may not do this in course "
            f"{self.target.course_id} (a teacher's or TA's token is needed)",
            404: f"no such course, assignment or student (course {self.target.course_id}: "
            "check --canvas-course, --canvas-assignment and the student's Canvas user id)",
        }.get(exc.code, "Canvas failed")
        return CanvasError(f"{self.who}: Canvas answered {exc.code} to {what}: {meaning}{said}")


def _canvas_message(exc: urllib.error.HTTPError) -> str:
    """Canvas's own words (``{"errors": [{"message": ...}]}``), shortened; never headers."""
    try:
        data = json.loads(exc.read().decode("utf-8"))
    except Exception:
        return ""
    errors = data.get("errors") if isinstance(data, dict) else None
    if isinstance(errors, list) and errors and isinstance(errors[0], dict):
        return f" (Canvas: {str(errors[0].get('message', ''))[:200]})"
    if isinstance(errors, dict):
        return f" (Canvas: {json.dumps(errors)[:200]})"
    return ""


def _short(url: str) -> str:
    """A URL without its query (an upload URL's query may hold a signature)."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def _host(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _multipart(fields: list[tuple[str, str]], name: str, data: bytes) -> tuple[bytes, str]:
    """multipart/form-data: ``fields`` in order, then the file last (as Canvas requires)."""
    boundary = f"tl-{uuid.uuid4().hex}"
    chunks = []
    for key, value in fields:
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="{key}"\r\n\r\n'
        chunks.append(f"{head}{value}\r\n".encode())
    quoted = name.replace('"', "%22")
    chunks.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{quoted}"\r\n'
        "Content-Type: text/html\r\n\r\n".encode()
    )
    chunks.append(data + f"\r\n--{boundary}--\r\n".encode())
    return b"".join(chunks), f"multipart/form-data; boundary={boundary}"


def _upload(client: _Client, item: Item, path: str) -> int:
    """Steps 1 to 3 of Canvas's upload flow; return the new file's id."""
    data = item.page.read_bytes()
    form = [("name", item.page_name), ("size", str(len(data))), ("content_type", "text/html")]
    start = client.call("POST", f"{path}/comments/files", form=form).json()
    if not isinstance(start, dict) or not start.get("upload_url"):
        raise CanvasError(f"{client.who}: Canvas's answer to POST {path}/comments/files has no "
                          "upload_url")  # fmt: skip
    params = start.get("upload_params") or {}
    body, ctype = _multipart([(str(k), str(v)) for k, v in params.items()], item.page_name, data)
    done = client.call("POST", str(start["upload_url"]), body=body, content_type=ctype, auth=False)
    found = done.json()
    if isinstance(found, dict) and found.get("id") is not None and done.status < 300:
        return int(found["id"])
    location = done.headers.get("Location") or done.headers.get("location")
    if not location:
        raise CanvasError(f"{client.who}: the upload's answer ({done.status}) names no file")
    location = urllib.parse.urljoin(str(start["upload_url"]), location)
    confirmed = client.call("GET", location).json()
    if not isinstance(confirmed, dict) or confirmed.get("id") is None:
        raise CanvasError(f"{client.who}: GET {_short(location)} did not return the file's id")
    return int(confirmed["id"])


def _send(client: _Client, item: Item, journal: dict[str, Any], save: Any) -> dict[str, Any]:
    """Upload (unless the journal has the file) and attach it with the comment and grade."""
    path = client.target.submission(item.lab, item.user_id)
    entry = journal.setdefault(item.key(client.target), {})
    digest = item.digest()
    if entry.get("digest") != digest:
        entry.clear()
        entry["digest"] = digest
    if entry.get("file_id") is None:
        entry["file_id"] = _upload(client, item, path)
        save()
    form = [("comment[text_comment]", item.text), ("comment[file_ids][]", str(entry["file_id"]))]
    if item.grade:
        form.append(("submission[posted_grade]", item.grade))
    client.call("PUT", path, form=form)
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


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    tmp.replace(path)


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
    _write_json(out / PLAN, {"canvas": target.root, "course_id": target.course_id,
                             "dry_run": dry_run, "comments": plan})  # fmt: skip
    report.written.append(out / PLAN)
    client = _Client(target, token, token_env)
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
            client.who = f"{item.student} {item.lab} (Canvas user {item.user_id})"
            try:
                done = _send(client, item, journal, lambda: _write_json(journal_path, everything))
            except CanvasError as exc:
                lines.append(f"FAILED        {exc}")
                if exc.fatal:
                    stopped = "an earlier request failed for every student alike"
                continue
            lines.append(f"sent          {label}: file {done['file_id']} {item.page_name}"
                         + (f", grade {item.grade}" if item.grade else ""))  # fmt: skip
    return report, lines
