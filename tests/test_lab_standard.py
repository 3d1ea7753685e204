"""Every lab follows the lab standard (docs/labs.md), and `labs new` starts one that does.

The standard is code (:mod:`transformer_lab.grading.standard`); this test walks every lab's
source notebook with it, so a lab that drifts (an intro without the grading paragraph, a test
cell whose comment and points disagree, a free code cell, no demo on the student's code...)
fails here with the cell and what to change.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from transformer_lab.checks import spec
from transformer_lab.grading.course import course_settings, list_labs
from transformer_lab.grading.standard import (
    HOW_GRADING_WORKS,
    lint_lab,
    new_lab,
    setup_cell_imports,
    setup_cell_source,
)

REPO = Path(__file__).resolve().parents[1]
LABS = list_labs(REPO)


@pytest.mark.parametrize("lab", LABS)
def test_every_lab_follows_the_standard(lab: str) -> None:
    nb = nbformat.read(str(REPO / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
    assert lint_lab(nb, lab, course_settings(REPO).kit_source) == []


def test_labs_new_starts_a_lab_that_follows_the_standard(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "solutions").mkdir(parents=True)
    shutil.copy(REPO / "nbgrader_config.py", repo / "nbgrader_config.py")
    written = new_lab(repo, "09_vision_transformer", "Vision Transformers", "https://x/kit.whl")
    assert [p.relative_to(repo).as_posix() for p in written] == [
        "solutions/09_vision_transformer/09_vision_transformer.ipynb",
        "transformer_lab/checks/lab09.py",
        "transformer_lab/grading/hidden/lab09.py",
        "transformer_lab/checks/specs/lab09.toml",
    ]
    nb = nbformat.read(str(written[0]), as_version=4)
    assert lint_lab(nb, "09_vision_transformer", "https://x/kit.whl") == []
    for path in written[1:3]:
        compile(path.read_text(), str(path), "exec")
    new_spec = spec.parse(written[3].read_text())
    assert spec.lint_spec(new_spec, nb, "09_vision_transformer") == []
    with pytest.raises(FileExistsError):
        new_lab(repo, "09_vision_transformer", "again")


def test_the_lint_finds_drift() -> None:
    lab = "01_positional_encoding"
    nb = nbformat.read(str(REPO / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
    nb.cells[0].source = nb.cells[0].source.replace(HOW_GRADING_WORKS, "Grading: see below.")
    test = next(c for c in nb.cells if c.source.startswith("# Visible check (2 points)"))
    test.source = test.source.replace("(2 points)", "(3 points)")
    nb.cells.insert(5, nbformat.v4.new_code_cell("print('a free cell')"))
    problems = "\n".join(lint_lab(nb, lab))
    assert "How grading works" in problems
    assert "starts with '# Visible check (2 points)" in problems
    assert "free code cell" in problems


def test_setup_cell_keeps_the_labs_imports_and_nothing_else() -> None:
    source = setup_cell_source("03_x", "https://x", ["import torch", "from torch import nn"])
    assert setup_cell_imports(source) == ["import torch", "from torch import nn"]
    assert 'KIT_SOURCE = "https://x"' in source and 'lab.setup("03_x")' in source
    assert "from transformer_lab.checks import lab03" in source


@pytest.mark.parametrize("lab", LABS)
def test_every_labs_spec_agrees_with_its_notebook_and_the_kit(lab: str) -> None:
    nb = nbformat.read(str(REPO / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
    assert spec.lint_spec(spec.load(lab), nb, lab) == []


def test_every_graded_answer_of_the_kit_belongs_to_a_part_of_its_labs_spec() -> None:
    import importlib
    import pkgutil

    import transformer_lab
    from transformer_lab.graded import GRADED

    modules = [
        info.name
        for info in pkgutil.walk_packages(transformer_lab.__path__, "transformer_lab.")
        if ".grading" not in info.name
    ]
    for module in modules:
        importlib.import_module(module)
    claimed = {k for s in spec.all_specs() for p in s.parts.values() for k in p.kit}
    # the package's own answers (other tests register copies of its modules under new names)
    kit_answers = {n for n in GRADED if n.rsplit(".", 1)[0] in modules
                   or n.rsplit(".", 2)[0] in modules}  # fmt: skip
    assert kit_answers - claimed == set()


def test_the_spec_lint_finds_drift() -> None:
    lab = "03_multi_head_attention"
    nb = nbformat.read(str(REPO / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
    text = (REPO / "transformer_lab" / "checks" / "specs" / "lab03.toml").read_text()
    drifted = {
        "a cost outside its part": text.replace(
            '"split_heads split_assert" = ["test_split_heads_divisible"]',
            '"split_heads split_assert" = ["test_mha_visible"]',
        ),
        "an unknown stand-in": text.replace('"_merge_heads"', '"_no_such_stand_in"'),
        "a later part built on": text.replace("merge_heads = ", "load_torch_weights = "),
        "a kit name of another lab": text.replace(
            '"transformer_lab.attention.split_heads"', '"transformer_lab.attention.softmax"'
        ),
    }
    for what, changed in drifted.items():
        assert changed != text, what
        assert spec.lint_spec(spec.parse(changed), nb, lab), what
    with pytest.raises(spec.SpecError, match="unknown keys"):
        spec.parse(text.replace("[parts.split_heads]", "[parts.split_heads]\npoint = 3"))


def test_the_lint_counts_attributes_the_class_assigns_not_those_it_reads() -> None:
    """A layer the checks read must be set in the solution (``self.norm1 = ...``, in a tuple or
    annotated too); a class that only calls ``self.norm3(x)`` does not set ``norm3``."""
    source = (
        "class Block:\n"
        "    def __init__(self):\n"
        "        self.norm1, self.norm2 = 1, 2\n"
        "        self.ff: int = 3\n"
        "    def forward(self, x):\n"
        "        return self.norm3(other.attn(x))\n"
    )
    assert spec._self_assigned(ast.parse(source)) == {"norm1", "norm2", "ff"}


def _drifting_parts(lab_spec: spec.LabSpec) -> tuple[spec.Part, spec.Part]:
    """A function part whose signature has a default, and a class part with methods (chosen
    from the spec, so that no test here names a part: renaming one touches no test)."""
    parts = list(lab_spec.parts.values())
    function = next(p for p in reversed(parts) if not p.methods and "=" in p.signature)
    return function, next(p for p in parts if p.methods)


def test_the_spec_lint_names_points_and_signatures_the_notebook_disagrees_with() -> None:
    """A part's points, signature and attributes are declared once, in the spec: the notebook's
    heading and solution cell are held to them, and the first disagreement is named."""
    lab = "08_language_models"
    nb = nbformat.read(str(REPO / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
    text = (REPO / "transformer_lab" / "checks" / "specs" / "lab08.toml").read_text()
    part, cls = _drifting_parts(spec.load(lab))
    sig, points, method = part.signature, part.points or 0, cls.methods[0]
    head = f'points = {points}\nsignature = "{sig}"\n'  # the part's own points
    renamed = sig.replace("(", "(renamed_", 1)
    fewer = re.sub(r", [^,()]+\)$", ")", sig)  # its last argument left out
    more = method.replace("(", "(renamed_", 1)
    drifted = {
        "points": (
            text.replace(head, head.replace(f"= {points}", f"= {points + 1}", 1)),
            f"{part.name} is worth {points + 1} points; the notebook's heading gives {points}",
        ),
        "an argument": (
            text.replace(f'"{sig}"', f'"{renamed}"'),
            f"{part.name}'s signature {renamed} is not the solution's {sig}",
        ),
        "an argument too few": (
            text.replace(f'"{sig}"', f'"{fewer}"'),
            f"{part.name}'s signature {fewer} is not the solution's {sig}",
        ),
        "a method": (
            text.replace(f'"{method}"', f'"{more}"'),
            f"{cls.name}'s signature {more} is not the solution's {method}",
        ),
        "no points": (
            text.replace(head, head.partition("\n")[2]),
            f"{part.name} declares no points (its heading gives {points})",
        ),
        "an attribute": (
            text.replace(f'"{cls.attributes[0]}"', f'"renamed_{cls.attributes[0]}"'),
            f"{cls.name}'s solution has no attribute renamed_{cls.attributes[0].split()[0]}",
        ),
    }
    for what, (changed, says) in drifted.items():
        assert changed != text, what
        problems = "\n".join(spec.lint_spec(spec.parse(changed), nb, lab))
        assert says in problems, (what, problems)
    assert spec.lint_spec(spec.parse(text), nb, lab) == []


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('signature = "kv(n_layers,"', r"parts\.kv\.signature = .* is not a signature"),
        (
            'signature = "kv_bytes(n_layers)"',
            r"parts\.kv\.signature = .* calls 'kv_bytes', not 'kv'",
        ),
        ("points = 0", r"parts\.kv\.points must be a positive integer, not 0"),
        ('points = "2"', r"parts\.kv\.points must be a positive integer"),
        ('methods = ["forward(x"]', r"parts\.kv\.methods = 'forward\(x' is not a signature"),
        ('check = "kv"', r"parts\.kv\.check must name a check_"),
        ('replaces = "x.kv"', r"parts\.kv\.replaces must be one of its kit answers"),
    ],
)
def test_a_bad_part_key_is_a_spec_error_naming_the_file_and_the_part(line: str, says: str) -> None:
    with pytest.raises(spec.SpecError, match=says) as raised:
        spec.parse(f'lab = "09_x"\n[parts.kv]\n{line}\n', "specs/lab09.toml")
    assert str(raised.value).startswith("specs/lab09.toml: parts.kv.")


def test_the_curriculum_shows_the_specs_table_of_graded_parts() -> None:
    notebooks = {
        lab: nbformat.read(str(REPO / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
        for lab in LABS
    }
    table = spec.costs_table(list(spec.all_specs()), notebooks)
    curriculum = (REPO / "docs" / "curriculum.md").read_text()
    assert table in curriculum, "docs/curriculum.md: paste the table printed by\n" + table


def test_the_curriculum_writes_every_signature_as_the_spec_declares_it() -> None:
    curriculum = (REPO / "docs" / "curriculum.md").read_text()
    specs = list(spec.all_specs())
    assert spec.lint_curriculum(specs, curriculum) == []
    sig = _drifting_parts(spec.load("08_language_models"))[0].signature
    respaced = curriculum.replace(sig, sig.replace(", ", " ,  "))  # the same call
    assert respaced != curriculum and spec.lint_curriculum(specs, respaced) == []
    renamed = sig.replace("(", "(renamed_", 1)
    assert spec.lint_curriculum(specs, curriculum.replace(sig, renamed)) == [
        f"the curriculum's row of 08_language_models writes {renamed}; its spec: {sig}"
    ]


def test_the_readme_lists_every_labs_parts_as_its_spec_does() -> None:
    readme = (REPO / "README.md").read_text()
    specs = list(spec.all_specs())
    assert spec.lint_readme(specs, readme) == []
    lab_spec = spec.load("07_nlp_pipeline")
    first, second = list(lab_spec.parts)[:2]
    swapped = readme.replace(f"`{first}`, `{second}`", f"`{second}`, `{first}`")
    parts = ", ".join(lab_spec.parts)
    assert swapped != readme
    assert spec.lint_readme(specs, swapped) == [
        f"README's row of 07_nlp_pipeline lists {second}, {first}, "
        f"{parts.removeprefix(f'{first}, {second}, ')}; its spec: {parts}"
    ]
    stray = readme.replace(f"`{first}`, `{second}`", f"`{first}`, `{first}_v2`, `{second}`")
    assert spec.lint_readme(specs, stray) == [
        f"README's row of 07_nlp_pipeline lists {parts.replace(first, f'{first}, {first}_v2', 1)}"
        f"; its spec: {parts}"
    ]


@pytest.mark.parametrize("lab", LABS)
def test_the_labs_bans_refuse_every_kit_answer_its_spec_names(lab: str) -> None:
    """A check's ban must refuse the kit's own answer of each part: calling it is no answer."""
    import importlib

    from transformer_lab.judge.bans import Ban, _code_objects

    lab_spec = spec.load(lab)
    for part in lab_spec.parts.values():
        own = [lab_spec.ban(name) for name in part.bans]
        refused = _code_objects([f for ban in own for f in ban.functions])
        for dotted in part.kit:
            answer = _code_objects([dotted])
            assert answer and set(answer) <= set(refused), f"{lab}: no ban refuses {dotted}"
    # the checks' bans are the spec's, written nowhere else
    checks = importlib.import_module(f"transformer_lab.checks.lab{lab[:2]}")
    bans = {value for value in vars(checks).values() if isinstance(value, Ban)}
    assert bans and bans <= {lab_spec.ban(name) for name in lab_spec.bans}
    assert "= Ban(" not in Path(checks.__file__).read_text()


def test_the_spec_lint_finds_a_ban_that_drifted() -> None:
    lab = "04_transformer_block"
    nb = nbformat.read(str(REPO / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
    text = (REPO / "transformer_lab" / "checks" / "specs" / "lab04.toml").read_text()
    drifted = {
        "an unknown ban": (
            text.replace('bans = ["feed_forward"]', 'bans = ["feedforward"]'),
            "names the ban 'feedforward'",
        ),
        "a kit answer no ban of its part refuses": (
            text.replace('"transformer_lab.blocks.FeedForward", "torch', '"torch', 1),
            "'transformer_lab.blocks.FeedForward' is refused by none",
        ),
        "a banned name that does not exist": (
            text.replace('"torch.nn.TransformerEncoder"]', '"torch.nn.TransformerEncodr"]'),
            "'torch.nn.TransformerEncodr', which does not exist",
        ),
        "an op that does not exist": (
            text.replace('ops = ["normalization"]', 'ops = ["normalisation"]'),
            "'normalisation', no op family or operator",
        ),
        "a ban no part holds": (text + '\n[bans.spare]\nreason = "x"\n', "no part holds"),
    }
    for what, (changed, says) in drifted.items():
        assert changed != text, what
        problems = "\n".join(spec.lint_spec(spec.parse(changed), nb, lab))
        assert says in problems, (what, problems)
    with pytest.raises(spec.SpecError, match="positive number"):
        spec.parse(text.replace("large_mean = 1e-2", "large_mean = -1"))
    with pytest.raises(spec.SpecError, match=r"\{atol = number, rtol = number\}"):
        spec.parse(text.replace("large_mean = 1e-2", "large_mean = { atol = 1e-2 }"))
    pair = spec.parse(text.replace("large_mean = 1e-2", "large_mean = { atol = 1e-2, rtol = 3 }"))
    assert pair.close_tol("large_mean") == {"atol": 1e-2, "rtol": 3.0}
    with pytest.raises(spec.SpecError, match="use close_tol"):
        pair.tol("large_mean")
    with pytest.raises(spec.SpecError, match="use tol"):
        pair.close_tol("float32")
    with pytest.raises(spec.SpecError, match=r"no \[bans\.nothing\]"):
        spec.load(lab).ban("nothing")
    with pytest.raises(spec.SpecError, match="no tolerance 'half'"):
        spec.load("01_positional_encoding").tol("half")


def _setup_stops(kit_source: str, pip_stderr: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """What the setup cell's install part says when it stops, on a machine without the kit."""
    import subprocess
    import sys

    source = setup_cell_source("01_x", kit_source).split("\nimport torch")[0]
    source = source.split("\nfrom transformer_lab import lab")[0]
    monkeypatch.setitem(sys.modules, "transformer_lab", None)  # `import transformer_lab` fails
    failed = subprocess.CompletedProcess([], 1, "", pip_stderr)
    monkeypatch.setattr(subprocess, "run", lambda *args, **kwargs: failed)
    with pytest.raises(SystemExit) as stop:
        exec(compile(source, "<setup>", "exec"), {})
    return str(stop.value)


def test_the_setup_cell_says_in_one_line_that_latest_json_is_unreachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    said = _setup_stops("http://127.0.0.1:9/kit/", "", monkeypatch)
    assert said.startswith("Could not read http://127.0.0.1:9/kit/latest.json (")
    assert "pip" not in said and "\n" not in said and "ask your instructor" in said


def test_a_failed_install_quotes_pips_error_without_colour_codes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inside a Jupyter kernel pip's last line is a colour code: the error line is quoted."""
    stderr = (
        "\x1b[33mWARNING: Retrying after connection broken\x1b[0m\n"
        "\x1b[31mERROR: HTTP error 404 while getting http://127.0.0.1:9/kit/k.whl\x1b[0m\n"
        "\x1b[0m\n"
    )
    said = _setup_stops("http://127.0.0.1:9/kit/k.whl", stderr, monkeypatch)
    assert said.startswith(
        "Could not install the kit from http://127.0.0.1:9/kit/k.whl (ERROR: HTTP error 404 "
        "while getting http://127.0.0.1:9/kit/k.whl). Check the internet connection"
    ), said
    assert "\x1b" not in said
