"""Feedback a hostile notebook cannot use: inert HTML, no history, nothing after a hidden check.

Each test builds an "executed" notebook by hand, as the grader would read it back, with the
outputs a student's code can produce, and passes it through :func:`feedback_notebook` and
:func:`render_html`, exactly as ``labs grade`` does.
"""

from __future__ import annotations

import base64

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
