"""Issue 41, class 4, through the real grader: a submission that writes its own feedback page.

One hostile submission of lab 01, graded by ``labs grade`` in the bubblewrap sandbox beside an
honest one, carries every attack of the class at once:

* its ``sinusoidal_encoding`` raises an ``AssertionError`` whose text the visible checks quote:
  a markdown image and link to a loopback server, a ``javascript:`` link, a fake
  "12 / 12 points: passed" in bold;
* a cell displays a PNG whose metadata carries ``width="1 onerror=..."`` and a
  ``filenames`` entry pointing at the server, and prints a fake score box in 24-bit ANSI colours;
* its written answer and a markdown cell it marked "locked" itself hold images from the
  server, a ``javascript:`` link, a script and a span dressed as the grader's score box.

Then ``labs render --feedback`` draws the pages (no request may reach the server), and the
hostile page is opened as its student would, served over HTTP in an ordinary Chromium with
JavaScript on: it may fetch nothing either. The honest student keeps full marks, and its page
(all checks passed) and the hostile one (failed-checks table on top) are screenshotted at 1280 px.
"""

from __future__ import annotations

import base64
import html
import json
import re
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from conftest import LoopbackServer, needs_bwrap

from transformer_lab.grading import browser
from transformer_lab.grading.cli import main

REPO = Path(__file__).resolve().parents[1]
LAB = "01_positional_encoding"
PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
    )
).decode()
FAKE_BOX = "12 / 12 points: passed"
pytestmark = [pytest.mark.slow, needs_bwrap]


def _quoted(base: str) -> str:
    return (
        f"![q]({base}/quoted.png) [more]({base}/quoted-link) [run](javascript:alert(1)) "
        f"**{FAKE_BOX}**"
    )


def _answer(base: str) -> str:
    return f"""\
import torch
def sinusoidal_encoding(seq_len, d_model, base=10000.0):
    raise AssertionError({_quoted(base)!r})
"""


def _display(base: str) -> str:
    metadata = {
        "image/png": {"width": "1 onerror=document.title='pwned'", "height": 1},
        "filenames": {"image/png": f"{base}/filenames.png"},
    }
    return f"""\
from IPython.display import display
display({{"image/png": {PNG!r}, "text/plain": "<figure>"}}, raw=True, metadata={metadata!r})
print("\\x1b[48;2;230;244;234m\\x1b[38;2;0;0;0m {FAKE_BOX} \\x1b[0m")
"""


def _markdown(base: str) -> str:
    return (
        f"![md]({base}/markdown.png) [x](javascript:alert(2)) <img src=//127.0.0.1/p.png>\n\n"
        f'<span class="tl-points tl-pass">{FAKE_BOX}</span><img src="{base}/html.png">'
        "<script>document.title='pwned'</script>"
    )


def _hostile(base: str) -> nbformat.NotebookNode:
    nb = nbformat.read(str(REPO / "solutions" / LAB / f"{LAB}.ipynb"), as_version=4)
    at = {c.metadata.get("nbgrader", {}).get("grade_id"): i for i, c in enumerate(nb.cells)}
    nb.cells[at["sinusoidal_encoding"]].source = _answer(base)
    nb.cells[at["written_small_base"]].source = _markdown(base)
    nb.cells.insert(at["sinusoidal_encoding"] + 1, nbformat.v4.new_code_cell(_display(base)))
    forged = nbformat.v4.new_markdown_cell(_markdown(base))
    forged.metadata["nbgrader"] = {"locked": True, "solution": False, "grade": False}
    nb.cells.insert(1, forged)
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict, Any]]:
    """One sandboxed ``labs grade`` run (hostile and honest) while the server listens."""
    course = tmp_path_factory.mktemp("hostile_feedback") / "course"
    with LoopbackServer(b"\x89PNG", "image/png") as server:
        base = server.url.rsplit("/", 1)[0]
        notebooks = {
            "hostile": _hostile(base),
            "honest": nbformat.read(str(REPO / "solutions" / LAB / f"{LAB}.ipynb"), 4),
        }
        for student, nb in notebooks.items():
            folder = course / "submitted" / student / LAB
            folder.mkdir(parents=True)
            nbformat.write(nb, str(folder / f"{LAB}.ipynb"))
        grade = ["grade", "--course", str(course), "--jobs", "2", "--sandbox", "required"]
        assert main(["--repo", str(REPO), *grade, "--timeout", "60", "--budget", "200"]) == 0
        report = json.loads((course / "grading_report.json").read_text())
        server.paths.clear()  # from here on, any request is the page's
        yield course, {r["student"]: r for r in report["runs"][-1]["results"]}, server


def _page(course: Path, student: str) -> str:
    return (course / "feedback" / student / LAB / f"{LAB}.html").read_text(encoding="utf-8")


def test_the_honest_student_keeps_full_marks_and_the_attack_its_quoted_text(graded) -> None:
    course, results, _ = graded
    assert results["honest"]["status"] == "graded" and results["honest"]["auto_score"] == 12
    hostile = results["hostile"]
    assert hostile["status"] == "graded", hostile["flags"]
    assert hostile["auto_score"] == 6  # relative_shift_matrix's six points
    quoted = hostile["verdicts"]["test_sinusoidal_encoding_shape"]["message"]
    assert FAKE_BOX in quoted  # the judge quotes it: the page must show it as text
    assert "Checks that did not pass" not in _page(course, "honest")


def test_the_hostile_page_shows_the_students_text_and_runs_or_loads_nothing(graded) -> None:
    course, results, server = graded
    verdicts = results["hostile"]["verdicts"]
    page = _page(course, "hostile")
    body = page.split("</style>")[-1]
    addresses = re.findall(r"""[\s"'](?:src|href|srcset|action)\s*=\s*["']?([^"'\s>]*)""", page)
    assert [a for a in addresses if not a.startswith(("data:", "#"))] == []
    assert "<script" not in page and re.search(r"<[^>]*\son[a-z]+\s*=", body) is None
    # The only score boxes that say "passed" are the grader's, one per check that passed.
    passed = [v for v in verdicts.values() if v["score"] == v["max_score"]]
    assert len(re.findall(r"<[^>]*\btl-pass\b", body)) == len(passed) == 4
    text = html.unescape(re.sub(r"<[^>]+>", "", body))
    assert f"[run](javascript:alert(1)) **{FAKE_BOX}**" in text  # the quoted text, as text
    assert "rgb(" not in body and "#e6f4ea" not in body.lower()
    # The failed-checks table opens the page and links to each lost check's cell.
    table = body.split('<table class="tl-failed">')[1].split("</table>")[0]
    for gid in ("test_sinusoidal_encoding_shape", "test_sinusoidal_encoding_values"):
        assert f'href="#check-{gid}"' in table and f'id="check-{gid}"' in body
    assert server.paths == []


def _table_lines(image: Any) -> int:
    """Rows of the top 800 px ruled across 500 px in the table's border grey (#ccc)."""
    top = image.convert("RGB").crop((0, 0, image.width, 800))
    width = top.width
    pixels = list(top.getdata())
    rows = (pixels[y * width : (y + 1) * width] for y in range(top.height))
    return sum(1 for row in rows if sum(p == (204, 204, 204) for p in row) >= 500)


def test_labs_render_feedback_draws_the_pages_without_a_request(graded, tmp_path: Path) -> None:
    course, _, server = graded
    if browser.browser() is None:
        pytest.skip("no Chromium installed")
    out = tmp_path / "drawn"
    assert main(["--repo", str(REPO), "render", "--feedback", str(course), "--out", str(out)]) == 0
    from PIL import Image

    lines = {}
    for student in ("hostile", "honest"):
        with Image.open(out / student / f"{LAB}.png") as image:
            assert image.width == 1280
            lines[student] = _table_lines(image)
        assert (out / student / f"{LAB}.pdf").read_bytes()[:5] == b"%PDF-"
    # The failed-checks table is in sight at the top: its header and four rows, ruled.
    assert lines == {"hostile": 4 + 2, "honest": 0}, lines
    assert server.paths == []


def test_the_page_fetches_nothing_in_a_students_own_browser(graded) -> None:
    """Served over HTTP and opened in a plain Chromium (JavaScript and network on)."""
    course, _, _ = graded
    if browser.browser() is None:
        pytest.skip("no Chromium installed")
    page = _page(course, "hostile").encode()
    with LoopbackServer(page, "text/html") as site, tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        folder.chmod(0o755)
        prefix = browser._as_unprivileged(folder)
        assert prefix is not None
        command = browser.chromium_command(
            browser.browser(), folder / "profile", f"--screenshot={folder / 'shot.png'}", site.url
        )
        command = [*prefix, *(a for a in command if not a.startswith(("--proxy", "--host-res")))]
        command.insert(-1, "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1")
        subprocess.run(command, capture_output=True, timeout=180, env={"HOME": tmp})
        assert (folder / "shot.png").is_file()
        asked = list(site.paths)
    assert asked and set(asked) <= {"/tinyshakespeare.txt", "/favicon.ico"}, asked
