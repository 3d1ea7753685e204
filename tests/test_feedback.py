"""Feedback a hostile notebook cannot use: inert HTML, no history, nothing after a hidden check.

Each test builds an "executed" notebook by hand, as the grader would read it back, with the
outputs a student's code can produce, and passes it through :func:`feedback_notebook` and
:func:`render_html`, exactly as ``labs grade`` does.
"""

from __future__ import annotations

import base64
import html
import re

import nbformat
import pytest

pytest.importorskip("nh3")

from transformer_lab.grading.feedback import (
    AFTER_HIDDEN_NOTE,
    feedback_notebook,
    render_html,
    sanitize_html,
)

PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
    )
).decode()
HOSTILE = (
    '<script>document.title="pwned"</script>'
    '<span class="tl-points tl-pass" style="color:green">12 / 12 points: passed</span>'
    '<img src="x" onerror="alert(1)"><img src="https://evil.example/track.png">'
    '<a href="javascript:alert(2)" onclick="alert(3)">click</a>'
    '<iframe src="https://evil.example"></iframe><link rel="stylesheet" href="https://e/x.css">'
    "<style>.tl-fail{background:#e6f4ea}</style><b>bold stays</b>"
)


def _code(source: str, outputs: list, **nbgrader) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source)
    cell.outputs = outputs
    if nbgrader:
        cell.metadata["nbgrader"] = nbgrader
    return cell


def _display(data: dict) -> nbformat.NotebookNode:
    return nbformat.v4.new_output("display_data", data=data)


def _notebook(*cells) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = list(cells)
    return nb


def _feedback_html(nb, scores=None, notes=None) -> str:
    feedback = feedback_notebook(
        nb, scores or {}, title="lab 01, mallory", status="graded", notes=notes
    )
    return render_html(feedback)


def test_sanitize_html_leaves_nothing_active_or_styled() -> None:
    clean = sanitize_html(HOSTILE)
    for bad in ("<script", "onerror", "onclick", "javascript:", "evil.example", "<iframe"):
        assert bad not in clean
    for bad in ("class=", "style", "<link", "tl-pass"):
        assert bad not in clean
    assert "<b>bold stays</b>" in clean
    assert f'<img src="data:image/png;base64,{PNG}">' in sanitize_html(
        f'<img src="data:image/png;base64,{PNG}">'
    )


def test_hostile_html_output_is_inert_in_the_page_and_the_score_box_is_the_graders() -> None:
    nb = _notebook(
        _code("display(HTML(x))", [_display({"text/html": HOSTILE, "text/plain": "<HTML>"})]),
        _code("display(Javascript(x))", [_display({"application/javascript": "alert(4)"})]),
        _code("svg", [_display({"image/svg+xml": "<svg onload='alert(5)'></svg>"})]),
        _code("check()", [], grade=True, grade_id="t1", points=2, locked=True),
    )
    page = _feedback_html(nb, {"t1": (0.0, 2.0)}, {"t1": "the judge's message"})
    for bad in ("pwned", "alert(", "evil.example", "onerror", "onload"):
        assert bad not in page, bad
    # The only score boxes are the grader's own: one, for t1, which did not pass.
    assert page.count("tl-pass") == page.count(".tl-pass")  # the stylesheet's rule only
    assert page.count('class="tl-points tl-fail"') == 1
    assert "0 / 2 points: did not pass" in page and "the judge's message" in page
    assert "bold stays" in page  # inert HTML keeps its text


def test_figures_math_and_tables_still_render() -> None:
    prose = nbformat.v4.new_markdown_cell("The encoding is $\\sin(p / 10000^{2i/d})$.")
    prose.metadata["nbgrader"] = {"locked": True, "grade": False, "solution": False}
    answer = nbformat.v4.new_markdown_cell(
        "My answer: $x^2$ <script>alert(6)</script><b onmouseover='alert(7)'>bold</b> `a <b> c`"
    )
    answer.metadata["nbgrader"] = {"solution": True, "grade": True, "grade_id": "w1"}
    table = "<table><tr><th>loss</th></tr><tr><td>0.5</td></tr></table>"
    nb = _notebook(
        prose,
        answer,
        _code("plot()", [_display({"image/png": PNG, "text/plain": "<Figure>"})]),
        _code("df", [nbformat.v4.new_output("execute_result", data={"text/html": table})]),
    )
    page = _feedback_html(nb)
    assert f"data:image/png;base64,{PNG}" in page
    assert page.count("<math") >= 2  # the kit's prose and the student's answer
    assert "<th>loss</th>" in page and "<td>0.5</td>" in page
    assert "alert(" not in page and "onmouseover" not in page
    assert "<b>bold</b>" in page


def test_no_output_of_a_hidden_cell_or_after_it_reaches_feedback() -> None:
    history = "In = ['', 'secret_seed = 1234 # hidden oracle']"
    hidden_error = nbformat.v4.new_output(
        "error", ename="ValueError", evalue="student text: secret_seed=1234", traceback=["tb"]
    )
    nb = _notebook(
        _code("print('before')", [nbformat.v4.new_output("stream", name="stdout", text="ok\n")]),
        _code(
            "# checks x\n### BEGIN HIDDEN TESTS\nsecret_seed = 1234\n### END HIDDEN TESTS",
            [hidden_error],
            grade=True,
            grade_id="h1",
            points=3,
            locked=True,
        ),
        _code("print(In)", [nbformat.v4.new_output("stream", name="stdout", text=history)]),
        _code("print(_ih)", [_display({"text/plain": history, "text/html": history})]),
        _code("pass", []),
    )
    feedback = feedback_notebook(
        nb, {"h1": (0.0, 3.0)}, title="t", status="graded", notes={"h1": "wrong at x=0"}
    )
    page = render_html(feedback)
    assert "1234" not in page and "secret_seed" not in page and "student text" not in page
    assert "wrong at x=0" in page  # the judge's message
    assert "ok" in page  # outputs before the first hidden cell stay
    code = [c for c in feedback.cells if c.cell_type == "code"]
    assert code[1].outputs == []
    assert [o.text for o in code[2].outputs] == [AFTER_HIDDEN_NOTE]
    assert [o.text for o in code[3].outputs] == [AFTER_HIDDEN_NOTE]
    assert code[4].outputs == []


def test_raw_cells_and_the_title_cannot_carry_html() -> None:
    raw = nbformat.v4.new_raw_cell("<script>alert(8)</script>")
    raw.metadata["raw_mimetype"] = "text/html"
    feedback = feedback_notebook(
        _notebook(raw), {}, title="<img src=x onerror=alert(9)>", status="graded"
    )
    page = render_html(feedback)
    assert "<script>alert(8)" not in page and "onerror=alert(9)>" not in page


# ------------------------------------------------- issue 41, class 4: an allow-listed page

#: A student's own text as a visible check quotes it (an answer raising AssertionError).
QUOTED = (
    "![seen](http://127.0.0.1:9/quoted.png) [click](javascript:alert(10)) "
    "**12 / 12 points: passed** <b>bold?</b>\nsecond line"
)


def _urls(page: str) -> list[str]:
    """Every address the page's markup names (src, href, srcset, CSS url(...))."""
    found = re.findall(r"""[\s"'](?:src|href|srcset|action|data)\s*=\s*["']?([^"'\s>]*)""", page)
    return found + re.findall(r"url\(\s*['\"]?([^'\")]*)", page)


def _assert_inert(page: str) -> None:
    """Nothing on ``page`` runs or points anywhere but an inline image or its own anchors."""
    assert "<script" not in page.lower()
    assert re.search(r"<[^>]*\son[a-z]+\s*=", page) is None
    outside = [u for u in _urls(page) if not u.startswith(("data:", "#"))]
    assert outside == [], outside
    assert 'http-equiv="Content-Security-Policy"' in page and "default-src 'none'" in page


def test_the_graders_message_is_plain_text_never_markdown() -> None:
    nb = _notebook(
        _code("check_a()", [], grade=True, grade_id="t_a", points=1, locked=True),
        _code("check_b()", [], grade=True, grade_id="t_b", points=2, locked=True),
    )
    page = _feedback_html(nb, {"t_a": (0.0, 1.0), "t_b": (2.0, 2.0)}, {"t_a": QUOTED})
    _assert_inert(page)
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    # The student's characters are shown as they are: no image, no link, no bold box.
    assert "![seen](http://127.0.0.1:9/quoted.png)" in text
    assert "**12 / 12 points: passed** <b>bold?</b>" in text
    assert "<strong>12 / 12" not in page and "quoted.png" not in " ".join(_urls(page))
    assert page.count('class="tl-points tl-pass"') == 1  # t_b's, the grader's own
    assert page.count('class="tl-points tl-fail"') == 1


def test_output_metadata_keeps_only_numeric_image_sizes() -> None:
    png = {"image/png": PNG, "text/plain": "<Figure>"}
    hostile = {
        "image/png": {"width": "1 onerror=alert(11)", "height": 1e400},
        "filenames": {"image/png": "http://127.0.0.1:9/file.png"},
        "unconfined": True,
    }
    nb = _notebook(
        _code("plot()", [nbformat.v4.new_output("display_data", data=png, metadata=hostile)]),
        _code(
            "plot()",
            [
                nbformat.v4.new_output(
                    "display_data", data=png, metadata={"image/png": {"width": 320.4}}
                ),
                _display({"image/png": "not base64 <img src=x onerror=alert(12)>"}),
            ],
        ),
    )
    page = _feedback_html(nb)
    _assert_inert(page)
    body = page.split("</style>")[-1]
    assert "onerror" not in body and "file.png" not in body and "unconfined" not in body
    assert page.count(f'src="data:image/png;base64,{PNG}"') == 2
    assert re.search(r"\swidth=\"?320\b", page)  # a numeric size stays


def test_markdown_is_rendered_before_it_is_sanitised() -> None:
    cells = []
    for text, meta in (
        (
            "![md](http://127.0.0.1:9/md.png) [x](javascript:alert(13)) <img src=//evil.example/"
            "p.png> [ok](data:text/html,<script>alert(14)</script>)",
            {"solution": True, "grade": True, "grade_id": "w1", "points": 2},
        ),
        # A cell the student marked "locked" themselves: trusted by nothing.
        (
            '<span class="tl-points tl-pass">12 / 12 points: passed</span>'
            "<img src=http://127.0.0.1:9/locked.png><script>document.title='pwned'</script>",
            {"locked": True, "solution": False, "grade": False},
        ),
    ):
        cell = nbformat.v4.new_markdown_cell(text)
        cell.metadata["nbgrader"] = meta
        cells.append(cell)
    raw = nbformat.v4.new_raw_cell('<span class="tl-points tl-pass">raw</span>')
    page = _feedback_html(_notebook(*cells, raw))
    _assert_inert(page)
    body = page.split("</style>")[-1]
    assert "pwned" not in page and re.search(r"<[^>]*tl-pass", body) is None
    shown = html.unescape(re.sub(r"<[^>]+>", "", body))
    assert '<span class="tl-points tl-pass">raw</span>' in shown  # a raw cell: its text


def test_ansi_colours_are_reduced_to_the_fixed_palette() -> None:
    fake_box = "\x1b[48;2;230;244;234m\x1b[38;2;0;0;0m 12 / 12 points: passed \x1b[0m"
    text = f"{fake_box} \x1b[1;31mred\x1b[0m \x1b[7minverse\x1b[0m \x1b[48;5;120mbg\x1b[0m\n"
    nb = _notebook(
        _code("print()", [nbformat.v4.new_output("stream", name="stdout", text=text)]),
        _code("x", [nbformat.v4.new_output("execute_result", data={"text/plain": text})]),
        _code("raise", [nbformat.v4.new_output("error", ename="E", evalue=text, traceback=[])]),
    )
    page = _feedback_html(nb).split("</style>")[-1]
    assert "rgb(" not in page and "#e6f4ea" not in page.lower() and "-bg" not in page
    assert "ansi-red" in page and "12 / 12 points: passed" in page
    assert page.count("inverse") == 3  # the text stays, the inversion does not


def test_the_page_opens_with_the_failed_checks_each_linking_to_its_cell() -> None:
    nb = _notebook(
        _code("check_a()", [], grade=True, grade_id="t_a", points=1, locked=True),
        _code("check_b()", [], grade=True, grade_id="t_b", points=2, locked=True),
        _code("check_c()", [], grade=True, grade_id="t_c", points=3, locked=True),
    )
    scores = {"t_a": (0.0, 1.0), "t_b": (2.0, 2.0), "t_c": (0.0, 3.0)}
    notes = {"t_a": "first of a\nsecond of a", "t_c": "`f(3)` is wrong"}
    page = _feedback_html(nb, scores, notes)
    table = page.split('<table class="tl-failed">')[1].split("</table>")[0]
    rows = re.findall(r"<tr>(.*?)</tr>", table.split("<tbody>")[1])
    assert len(rows) == 2
    assert 'href="#check-t_a"' in rows[0] and ">1</td>" in rows[0] and "first of a" in rows[0]
    assert "second of a" not in table
    assert 'href="#check-t_c"' in rows[1] and ">3</td>" in rows[1]
    assert "<code>f(3)</code> is wrong" in rows[1]
    # Each link lands on its own cell (the code cell right after the anchor), after the table.
    for gid in ("t_a", "t_c"):
        after = page.split(f'<a id="check-{gid}"></a>')[1]
        assert after.startswith('<div class="jp-Cell jp-CodeCell')
        assert f"check_{gid[-1]}" in after.split("tl-result")[0]
    assert page.index("Checks that did not pass (2)") < page.index('id="check-t_a"')
    passed = _feedback_html(nb, {g: (m, m) for g, (_, m) in scores.items()})
    assert "Every check passed." in passed and "tl-failed" not in passed.split("</style>")[-1]
