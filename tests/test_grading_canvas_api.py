"""``labs export --lms canvas-api`` against a fake Canvas on 127.0.0.1, through canvasapi.

The fake implements what the kit (canvasapi, on its behalf) calls, as Canvas documents it
(``doc/api/file_uploads.md``, the Courses, Assignments, Submissions and Submission Comments
APIs): ``GET`` of the course, the assignment and the student's submission; the comment-file
upload (step 1 answers ``upload_url``/``upload_params``; step 2 takes a multipart POST with
``file`` last and no token, and answers a redirect to the confirmation, which completes the
upload and answers the file (canvasapi follows it without the token; the URL's ``uuid``
identifies the upload), or inst-fs's 201 with the file's JSON); the submission PUT with
``comment[text_comment]``, ``comment[file_ids][]`` and ``submission[posted_grade]``. A refused
token is Canvas's 401 with ``WWW-Authenticate``. It stores what Canvas would store, and every
request.
"""

from __future__ import annotations

import email.parser
import email.policy
import json
import re
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from lms_support import LAB1, graded_term, student

from transformer_lab.grading.canvas_api import JOURNAL, PLAN, CanvasTarget, push_feedback
from transformer_lab.grading.cli import main
from transformer_lab.grading.course import GradingError
from transformer_lab.grading.export import grade_value
from transformer_lab.grading.results import course_outcomes

TOKEN = "secret-token-7f3a"
COURSE_ID, ASSIGNMENT = "77", "101"
IDS = ("s01", "s02", "s03", "s07")
PAGE = f"{LAB1}_feedback.html"


class FakeCanvas:
    """A Canvas that stores comment files, comments and grades, and records every request."""

    def __init__(self, token: str = TOKEN, upload_answer: int = 301) -> None:
        self.token = token
        self.upload_answer = upload_answer
        self.fail: dict[tuple[str, str], int] = {}  # (method, user id) -> status
        self.requests: list[dict[str, Any]] = []
        self.pending: dict[int, dict[str, Any]] = {}
        self.files: dict[int, dict[str, Any]] = {}
        self.comments: dict[str, list[dict[str, Any]]] = {}
        self.grades: dict[str, str] = {}
        self._next = 1000
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        canvas = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                canvas.handle(self, "GET")

            def do_POST(self) -> None:
                canvas.handle(self, "POST")

            def do_PUT(self) -> None:
                canvas.handle(self, "PUT")

        return Handler

    def handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        path = urllib.parse.urlsplit(h.path).path
        auth = h.headers.get("Authorization", "")
        self.requests.append({"method": method, "path": path, "auth": auth, "body": body})
        base = rf"/api/v1/courses/{COURSE_ID}/assignments/(\d+)/submissions/(\d+)"
        if path.startswith("/upload/"):
            if auth:
                return self.answer(h, 400, {"errors": [{"message": "token sent to the store"}]})
            return self.upload(h, int(path.rsplit("/", 1)[1]), body)
        if m := re.fullmatch(r"/api/v1/files/(\d+)/create_success", path):
            number = int(m.group(1))
            if urllib.parse.parse_qs(urllib.parse.urlsplit(h.path).query) != {"uuid": ["x"]}:
                return self.answer(h, 401, {"errors": [{"message": "bad uuid"}]})
            self.files[number]["available"] = True
            return self.answer(h, 200, self._file(number))
        if auth != f"Bearer {self.token}":
            return self.answer(h, 401, {"errors": [{"message": "Invalid access token."}]},
                               authenticate=True)  # fmt: skip
        if path == f"/api/v1/courses/{COURSE_ID}" and method == "GET":
            return self.answer(h, 200, {"id": int(COURSE_ID), "name": "Transformers"})
        if m := re.fullmatch(rf"/api/v1/courses/{COURSE_ID}/assignments/(\d+)", path):
            if m.group(1) != ASSIGNMENT:
                return self.answer(h, 404, {"errors": [{"message": "The specified resource "
                                                       "does not exist."}]})  # fmt: skip
            return self.answer(h, 200, {"id": int(ASSIGNMENT), "course_id": int(COURSE_ID)})
        if (m := re.fullmatch(base, path)) and method == "GET":
            if status := self.fail.get(("GET", m.group(2))):
                return self.answer(h, status, {"errors": [{"message": "boom"}]})
            return self.answer(h, 200, {"id": 5, "assignment_id": int(m.group(1)),
                                        "user_id": int(m.group(2))})  # fmt: skip
        if m := re.fullmatch(base + "/comments/files", path):
            if status := self.fail.get(("POST", m.group(2))):
                return self.answer(h, status, {"errors": [{"message": "boom"}]})
            if m.group(1) != ASSIGNMENT:
                return self.answer(h, 404, {"errors": [{"message": "The specified resource "
                                                       "does not exist."}]})  # fmt: skip
            form = dict(urllib.parse.parse_qsl(body.decode()))
            self._next += 1
            self.pending[self._next] = {"name": form["name"], "size": int(form["size"])}
            return self.answer(h, 200, {
                "upload_url": f"{self.url}/upload/{self._next}",
                "upload_params": {"key": f"uploads/{self._next}", "filename": form["name"]},
            })  # fmt: skip
        if (m := re.fullmatch(base, path)) and method == "PUT":
            if status := self.fail.get(("PUT", m.group(2))):
                return self.answer(h, status, {"errors": [{"message": "boom"}]})
            form = urllib.parse.parse_qs(body.decode())
            user = m.group(2)
            ids = [int(i) for i in form.get("comment[file_ids][]", [])]
            assert all(self.files[i]["available"] for i in ids), "a file not confirmed"
            self.comments.setdefault(user, []).append(
                {"text": form["comment[text_comment]"][0], "files": [self.files[i] for i in ids]}
            )
            if "submission[posted_grade]" in form:
                self.grades[user] = form["submission[posted_grade]"][0]
            return self.answer(h, 200, {"id": 1, "user_id": int(user)})
        return self.answer(h, 404, {"errors": [{"message": "no such endpoint"}]})

    def upload(self, h: BaseHTTPRequestHandler, number: int, body: bytes) -> None:
        """Step 2: multipart, upload_params unchanged, file last; answer redirect or 201."""
        head = f"Content-Type: {h.headers['Content-Type']}\r\n\r\n".encode()
        msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
        parts = [(p.get_param("name", header="content-disposition"), p) for p in msg.iter_parts()]
        assert [name for name, _ in parts] == ["key", "filename", "file"], parts
        assert parts[0][1].get_content().strip() == f"uploads/{number}"
        pending = self.pending.pop(number)
        data = parts[-1][1].get_payload(decode=True)
        assert len(data) == pending["size"]
        self.files[number] = {
            "id": number, "display_name": pending["name"], "data": data, "available": False,
        }  # fmt: skip
        where = f"{self.url}/api/v1/files/{number}/create_success?uuid=x"
        if self.upload_answer == 201:  # inst-fs: the upload is complete, the file's JSON
            self.files[number]["available"] = True
            return self.answer(h, 201, self._file(number), location=f"{self.url}/api/v1/files/"
                               f"{number}")  # fmt: skip
        return self.answer(h, 301, None, location=where)

    def _file(self, number: int) -> dict[str, Any]:
        found = self.files[number]
        return {
            "id": number,
            "display_name": found["display_name"],
            "size": len(found["data"]),
            "url": f"{self.url}/files/{number}/download",
        }

    @staticmethod
    def answer(
        h: BaseHTTPRequestHandler,
        status: int,
        data: Any,
        location: str = "",
        authenticate: bool = False,
    ) -> None:
        payload = b"" if data is None else json.dumps(data).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(payload)))
        if location:
            h.send_header("Location", location)
        if authenticate:  # Canvas's answer to a token it does not accept
            h.send_header("WWW-Authenticate", 'Bearer realm="canvas-lms"')
        h.end_headers()
        h.wfile.write(payload)


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four students graded (s02 swapped sin and cos; s07's lab 02 flagged); roster kept."""
    course = tmp_path_factory.mktemp("canvas-api") / "course"
    (course / "lms").mkdir(parents=True)
    rows = ["id,first_name,last_name,email,lms_id"]
    rows += [",".join(student(sid)[:5]) for sid in IDS]
    (course / "lms" / "roster.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    graded_term(course, list(IDS))
    return course


@pytest.fixture
def course(graded: Path, tmp_path: Path) -> Path:
    """A fresh copy of the graded course (each test has its own journal)."""
    import shutil

    copy = tmp_path / "course"
    shutil.copytree(graded, copy)
    return copy


@pytest.fixture
def canvas() -> FakeCanvas:
    fake = FakeCanvas()
    yield fake
    fake.close()


def _target(canvas: FakeCanvas, grades: bool = True) -> CanvasTarget:
    return CanvasTarget(canvas.url, COURSE_ID, {LAB1: ASSIGNMENT}, grades=grades)


def _uid(sid: str) -> str:
    return student(sid)[4]


def test_each_student_receives_an_html_page_comment_and_grade(
    course: Path, canvas: FakeCanvas, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CANVAS_API_TOKEN", TOKEN)
    report, lines = push_feedback(course, tmp_path / "out", _target(canvas))
    assert sorted(canvas.comments) == sorted(_uid(s) for s in IDS), lines
    for sid in IDS:
        (comment,) = canvas.comments[_uid(sid)]
        (attached,) = comment["files"]
        assert attached["display_name"] == PAGE and attached["display_name"].endswith(".html")
        page = course / "feedback" / sid / LAB1 / f"{LAB1}.html"
        assert attached["data"] == page.read_bytes()
        assert comment["text"].startswith(f"{LAB1}: ")
        assert PAGE in comment["text"]
    swapped = canvas.comments[_uid("s02")][0]["text"]
    assert "Checks that failed: test_sinusoidal_encoding_hidden (sin and cos swapped); " in swapped
    assert "Every check passed." in canvas.comments[_uid("s01")][0]["text"]
    expected = {o.student: grade_value(o) for o in course_outcomes(course, [LAB1])}
    assert canvas.grades == {_uid(sid): expected[sid] for sid in IDS}
    assert canvas.grades[_uid("s01")] != canvas.grades[_uid("s02")]
    assert sum(line.startswith("sent") for line in lines) == 4
    # The token went to Canvas's API only: never to the file store (nor to the confirmation,
    # which canvasapi follows without it), the plan, the journal, a line.
    for request in canvas.requests:
        untokened = request["path"].startswith("/upload/") or "create_success" in request["path"]
        assert (request["auth"] == "") == untokened, request["path"]
    for text in [(tmp_path / "out" / PLAN).read_text(), (course / "lms" / JOURNAL).read_text(),
                 *lines, *report.left_out]:  # fmt: skip
        assert TOKEN not in text


def test_a_rerun_sends_nothing_new(
    course: Path, canvas: FakeCanvas, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CANVAS_API_TOKEN", TOKEN)
    push_feedback(course, tmp_path / "out", _target(canvas))
    before = len(canvas.requests)
    _, lines = push_feedback(course, tmp_path / "out", _target(canvas))
    assert len(canvas.requests) == before, "a re-run sent requests"
    assert all(line.startswith("already sent") for line in lines) and len(lines) == 4
    assert all(len(c) == 1 for c in canvas.comments.values())
    # A page that changed (the submission was graded again) is sent again, alone.
    page = course / "feedback" / "s03" / LAB1 / f"{LAB1}.html"
    page.write_text(page.read_text() + "<p>regraded</p>")
    _, lines = push_feedback(course, tmp_path / "out", _target(canvas))
    assert [line.split()[0] for line in lines].count("sent") == 1
    assert len(canvas.comments[_uid("s03")]) == 2


def test_dry_run_writes_the_plan_and_sends_nothing(
    course: Path, canvas: FakeCanvas, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.delenv("CANVAS_API_TOKEN", raising=False)  # no token needed to plan
    out = tmp_path / "out"
    code = main(
        ["export", "--lms", "canvas-api", "--course", str(course), "--out", str(out),
         "--canvas-url", canvas.url, "--canvas-course", COURSE_ID, "--canvas-assignment",
         f"01={ASSIGNMENT}", "--canvas-grades", "--dry-run"]
    )  # fmt: skip
    assert code == 0, capsys.readouterr()
    assert canvas.requests == []
    plan = json.loads((out / PLAN).read_text())
    assert plan["dry_run"] is True
    entries = {e["student"]: e for e in plan["comments"]}
    assert sorted(entries) == list(IDS)
    assert entries["s02"]["file"]["name"] == PAGE
    assert "sin and cos swapped" in entries["s02"]["text_comment"]
    assert entries["s01"]["posted_grade"] is not None
    put = entries["s01"]["requests"][-1]
    assert put["method"] == "PUT" and put["url"].endswith(f"/submissions/{_uid('s01')}")
    assert "would send    s01" in capsys.readouterr().out


def test_a_refused_token_is_named_and_stops(
    course: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    canvas = FakeCanvas(token="another-token")
    try:
        monkeypatch.setenv("CANVAS_API_TOKEN", TOKEN)
        code = main(
            ["export", "--lms", "canvas-api", "--course", str(course), "--out",
             str(tmp_path / "out"), "--canvas-url", canvas.url, "--canvas-course", COURSE_ID,
             "--canvas-assignment", f"01={ASSIGNMENT}"]
        )  # fmt: skip
    finally:
        canvas.close()
    out = capsys.readouterr()
    assert code == 1
    (failed,) = [line for line in out.out.splitlines() if line.startswith("FAILED")]
    assert "401 Unauthorized" in failed and "$CANVAS_API_TOKEN" in failed
    assert "s01" in failed and f"GET {canvas.url}/api/v1/courses/{COURSE_ID}" in failed
    assert len(canvas.requests) == 1, "a refused token must stop the run"
    assert out.out.count("not sent      ") == 3
    assert TOKEN not in out.out + out.err


def test_one_students_500_leaves_the_others_done(
    course: Path, canvas: FakeCanvas, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CANVAS_API_TOKEN", TOKEN)
    canvas.fail[("PUT", _uid("s02"))] = 500
    _, lines = push_feedback(course, tmp_path / "out", _target(canvas))
    (failed,) = [line for line in lines if line.startswith("FAILED")]
    assert "s02" in failed and "500" in failed and f"PUT {canvas.url}" in failed
    assert sorted(canvas.comments) == sorted(_uid(s) for s in IDS if s != "s02")
    # Canvas is fixed: the re-run sends s02 alone, and does not upload its page twice.
    del canvas.fail[("PUT", _uid("s02"))]
    before = len(canvas.requests)
    _, lines = push_feedback(course, tmp_path / "out", _target(canvas))
    assert [r["method"] for r in canvas.requests[before:] if r["method"] != "GET"] == ["PUT"]
    (comment,) = canvas.comments[_uid("s02")]
    assert comment["files"][0]["display_name"] == PAGE


def test_a_201_upload_answer_and_a_404_assignment(
    course: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    canvas = FakeCanvas(upload_answer=201)
    try:
        monkeypatch.setenv("CANVAS_API_TOKEN", TOKEN)
        push_feedback(course, tmp_path / "out", _target(canvas, grades=False))
        assert len(canvas.comments) == 4 and canvas.grades == {}
        wrong = CanvasTarget(canvas.url, COURSE_ID, {LAB1: "999"})
        _, lines = push_feedback(course, tmp_path / "out2", wrong)
    finally:
        canvas.close()
    failed = [line for line in lines if line.startswith("FAILED")]
    assert len(failed) == 4, "a 404 is one student's: the others are tried"
    assert "404" in failed[0] and "no such course, assignment or student" in failed[0]
    assert f"GET {canvas.url}/api/v1/courses/{COURSE_ID}/assignments/999" in failed[0]


def test_bad_values_are_named(
    course: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setenv("CANVAS_API_TOKEN", TOKEN)
    for url, said in (
        ("canvas.example.edu", "not an http(s) URL"),
        ("http://canvas.example.edu", "plain http"),
    ):
        with pytest.raises(GradingError, match=re.escape(repr(url)) + ".*" + re.escape(said)):
            push_feedback(course, tmp_path, CanvasTarget(url, COURSE_ID, {LAB1: ASSIGNMENT}))
    with pytest.raises(GradingError, match="--canvas-course 'abc'"):
        push_feedback(course, tmp_path, CanvasTarget("https://c.example", "abc", {LAB1: "1"}))
    args = ["export", "--lms", "canvas-api", "--course", str(course), "--out", str(tmp_path),
            "--canvas-assignment", f"01={ASSIGNMENT}"]  # fmt: skip
    assert main([*args, "--canvas-course", COURSE_ID]) == 2  # no --canvas-url
    assert main([*args, "--canvas-url", "https://c.example", "--canvas-course", "x"]) == 2
    err = capsys.readouterr().err
    assert "needs --canvas-url" in err and "--canvas-course 'x' is not a Canvas course id" in err
    monkeypatch.delenv("CANVAS_API_TOKEN")
    with pytest.raises(GradingError, match=r"\$CANVAS_API_TOKEN is empty"):
        push_feedback(course, tmp_path, CanvasTarget("https://c.example", "1", {LAB1: "1"}))


def test_no_connection_is_one_line_and_stops(
    course: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CANVAS_API_TOKEN", TOKEN)
    closed = FakeCanvas()
    url = closed.url
    closed.close()  # nothing listens there any more
    _, lines = push_feedback(course, tmp_path, CanvasTarget(url, COURSE_ID, {LAB1: ASSIGNMENT}))
    (failed,) = [line for line in lines if line.startswith("FAILED")]
    assert f"could not reach {url}" in failed
    assert sum(line.startswith("not sent") for line in lines) == 3


def test_a_403_and_a_401_for_one_action_are_that_students_lines(
    course: Path, canvas: FakeCanvas, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """canvasapi's ``Forbidden`` and ``Unauthorized`` (a 401 without ``WWW-Authenticate``: the
    token is good, this action is not allowed, e.g. a TA outside the student's section)."""
    monkeypatch.setenv("CANVAS_API_TOKEN", TOKEN)
    canvas.fail[("GET", _uid("s02"))] = 403
    canvas.fail[("PUT", _uid("s03"))] = 401
    _, lines = push_feedback(course, tmp_path / "out", _target(canvas))
    failed = {line.split()[1]: line for line in lines if line.startswith("FAILED")}
    assert sorted(failed) == ["s02", "s03"], lines
    assert "403 to GET " in failed["s02"] and "(Canvas: boom)" in failed["s02"]
    assert f"/submissions/{_uid('s02')}: the token's user may not" in failed["s02"]
    assert f"401 to PUT {canvas.url}" in failed["s03"] and "for this student" in failed["s03"]
    assert sorted(canvas.comments) == sorted(_uid(s) for s in IDS if s not in ("s02", "s03"))


def test_without_canvasapi_the_command_names_the_install(
    course: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setenv("CANVAS_API_TOKEN", TOKEN)
    monkeypatch.setitem(sys.modules, "canvasapi", None)  # import canvasapi: ImportError
    code = main(
        ["export", "--lms", "canvas-api", "--course", str(course), "--out", str(tmp_path),
         "--canvas-url", "https://canvas.example.edu", "--canvas-course", COURSE_ID,
         "--canvas-assignment", f"01={ASSIGNMENT}"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "needs canvasapi: pip install 'transformer-lab[lms]'" in err
    assert not (tmp_path / PLAN).exists(), "nothing planned or sent without the library"
