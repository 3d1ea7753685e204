"""The judge: points decided in the grader's process from plain data the kernel returns.

Unit tests drive :func:`judge_cell` through an in-process stand-in for the kernel (the real
kernel-side server, :mod:`transformer_lab.judge.kernel`, on a dict namespace); the last test
sends hostile submissions through the real ``labs grade`` in the sandbox (in lab 01's shared
class, ``judge_support.shared_class``).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import nbformat
import pytest
import torch
from conftest import needs_bwrap
from judge_support import (
    TRAINED_MODEL,
    InProcessKernel,
    answers_namespace,
    hand_in,
    shared_class,
    zeroing_attention,
)

from transformer_lab.grading.grade import judge_plan
from transformer_lab.grading.judge import (
    HIDDEN_ERROR_TEXT,
    HIDDEN_FAILURE,
    JudgeError,
    JudgeSession,
    Remote,
    judge_cell,
    student_names,
)
from transformer_lab.judge import kernel, wire

REPO = Path(__file__).resolve().parents[1]
LAB = "01_positional_encoding"


def _good_encoding(seq_len: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
    two_i = torch.arange(0, d_model, 2, dtype=torch.float32)
    angles = torch.arange(seq_len, dtype=torch.float32)[:, None] / base ** (two_i / d_model)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)  # (T, D)


VISIBLE = "lab01.check_sinusoidal_encoding(sinusoidal_encoding)\nprint('passed')\n"
HIDDEN = (
    "### BEGIN HIDDEN TESTS\n"
    "from transformer_lab.grading.hidden import lab01 as hidden01\n"
    "hidden01.hidden_check_sinusoidal_encoding(sinusoidal_encoding, seed=1101)\n"
    "### END HIDDEN TESTS\n"
)


def _judge(monkeypatch: pytest.MonkeyPatch, source: str, **names: Any):
    link = InProcessKernel(monkeypatch, dict(names))
    return judge_cell("test_cell", source, JudgeSession(link, timeout=10)), link


@pytest.mark.parametrize("source", [VISIBLE, HIDDEN])
def test_a_correct_answer_passes_visible_and_hidden_cells(
    monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    verdict, link = _judge(monkeypatch, source, sinusoidal_encoding=_good_encoding)
    assert verdict.passed and verdict.message == "" and verdict.requests >= 2
    # What went to the kernel: names and inputs only, never an expected value or a check.
    sent = " ".join(link.texts)
    assert "hidden_check" not in sent and "oracle" not in sent and "expected" not in sent


def test_a_typical_mistake_fails_with_its_named_message(monkeypatch: pytest.MonkeyPatch) -> None:
    def swapped(seq_len: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
        return _good_encoding(seq_len, d_model, base).reshape(seq_len, -1, 2).flip(-1).flatten(1)

    verdict, _ = _judge(monkeypatch, HIDDEN, sinusoidal_encoding=swapped)
    assert not verdict.passed and "sin and cos are swapped" in verdict.message
    assert verdict.mistake == "Your sin and cos are swapped"


def test_an_unwritten_answer_says_not_implemented(monkeypatch: pytest.MonkeyPatch) -> None:
    def stub(seq_len: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
        raise NotImplementedError()

    verdict, _ = _judge(monkeypatch, VISIBLE, sinusoidal_encoding=stub)
    assert not verdict.passed and "not implemented yet" in verdict.message


class LeakyError(Exception):
    """An exception class of the student's (its name is the student's text too)."""


def _raising(error: BaseException) -> Any:
    def answer(seq_len: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
        raise error

    return answer


@pytest.mark.parametrize(
    ("error", "visible_words", "hidden_words"),
    [
        (RuntimeError("seq_len=26 leaked"), "RuntimeError: seq_len=26 leaked", "RuntimeError"),
        (AssertionError("seq_len=26 leaked"), "seq_len=26 leaked", ""),
        (LeakyError("seq_len=26 leaked"), "LeakyError: seq_len=26 leaked", "of your own class"),
        (OSError("seq_len=26 leaked"), "OSError: seq_len=26 leaked", "OSError"),
    ],
)
def test_a_hidden_cell_never_shows_the_text_of_the_students_exception(
    monkeypatch: pytest.MonkeyPatch, error: BaseException, visible_words: str, hidden_words: str
) -> None:
    answer = _raising(error)
    visible, _ = _judge(monkeypatch, VISIBLE, sinusoidal_encoding=answer)
    assert not visible.passed and visible_words in visible.message  # help, in a visible cell
    link = InProcessKernel(monkeypatch, {"sinusoidal_encoding": answer})
    hidden = judge_cell("test_cell", HIDDEN, JudgeSession(link, timeout=10, hidden=True))
    assert not hidden.passed and hidden_words in hidden.message, hidden.message
    assert HIDDEN_ERROR_TEXT in hidden.message
    assert "leaked" not in hidden.message and "LeakyError" not in hidden.message


def test_a_hidden_check_reads_the_error_its_message_leaves_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check's logic sees the kernel's text (a ValueError must name the bad value); the
    hidden cell's message is fixed words, whatever the check's own text quoted."""
    reads = (
        "import sys\n"
        "try:\n"
        "    sinusoidal_encoding(3, 5)\n"
        "except (ValueError, KeyError):\n"
        "    error = sys.exc_info()[1]\n"
        "    assert 'd_model=5' in str(error), 'the check could not read the error'\n"
    )
    quotes = reads + "    raise AssertionError(f'it raised {type(error).__name__}: {error}')\n"
    for error in (ValueError("d_model=5 is odd"), KeyError("d_model=5 'odd'\n")):
        link = InProcessKernel(monkeypatch, {"sinusoidal_encoding": _raising(error)})
        verdict = judge_cell("cell", reads, JudgeSession(link, timeout=10, hidden=True))
        assert verdict.passed, verdict.message  # it read the text
        verdict = judge_cell("cell", quotes, JudgeSession(link, timeout=10, hidden=True))
        assert verdict.message == (
            f"A hidden check of `sinusoidal_encoding` failed: {HIDDEN_FAILURE}."
        ), verdict.message


def test_a_hidden_cell_words_a_refused_call_from_the_ban_it_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def uses_torch(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return torch.softmax(x, dim=dim)

    link = InProcessKernel(monkeypatch, {"softmax": uses_torch})
    source = "lab02.check_softmax(softmax)\n"
    verdict = judge_cell("test_cell", source, JudgeSession(link, timeout=10, hidden=True))
    assert not verdict.passed and "does not allow" in verdict.message, verdict.message
    assert "torch.softmax" not in verdict.message  # (the kernel's words name what it called)


def test_a_missing_name_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    verdict, _ = _judge(monkeypatch, VISIBLE)
    assert not verdict.passed and "`sinusoidal_encoding` is not defined" in verdict.message


class Agreeable(torch.Tensor):
    """A wrong tensor whose comparisons all say "equal" (the issue's dispatch attack)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("allclose", "isclose", "equal", "all"):
            return True
        return super().__torch_function__(func, types, args, kwargs or {})


def test_a_tensor_subclass_arrives_as_its_plain_data(monkeypatch: pytest.MonkeyPatch) -> None:
    def liar(seq_len: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
        return torch.zeros(seq_len, d_model).as_subclass(Agreeable)

    verdict, _ = _judge(monkeypatch, HIDDEN, sinusoidal_encoding=liar)
    assert not verdict.passed and "wrong at" in verdict.message


def test_the_checks_ban_is_forwarded_to_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    def uses_torch(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return torch.softmax(x, dim=dim)

    verdict, link = _judge(monkeypatch, "lab02.check_softmax(softmax)\n", softmax=uses_torch)
    assert not verdict.passed and "softmax" in verdict.message
    assert any('"ban"' in text for text in link.texts)


def test_objects_stay_in_the_kernel_behind_handles(monkeypatch: pytest.MonkeyPatch) -> None:
    class Counter:
        def __init__(self, start: int) -> None:
            self.count = start

        def add(self, n: int) -> list[int]:
            self.count += n
            return [self.count]

    link = InProcessKernel(monkeypatch, {"Counter": Counter})
    session = JudgeSession(link, timeout=5)
    counter = session.lookup("Counter")(3)
    assert isinstance(counter, Remote) and repr(counter) == "<your Counter>"
    assert counter.add(2) == [5] and counter.count == 5


@pytest.mark.parametrize(
    "reply",
    [
        "not json",
        '{"ok": true, "value": {"$pickle": "gASV"}}',
        '{"ok": true, "value": {"$tensor": "bm90IHNhZmV0ZW5zb3Jz"}}',
        '{"ok": true, "value": ' + "[" * 100 + "]" * 100 + "}",
        "[1, 2]",
    ],
)
def test_a_reply_that_is_not_data_scores_zero_with_the_reason(reply: str) -> None:
    class Forger:
        def exchange(self, text: str, timeout: float, answer: Any) -> str:
            return reply

    verdict = judge_cell("test_cell", VISIBLE, JudgeSession(Forger(), timeout=1))
    assert not verdict.passed and "no usable answer" in verdict.message


def test_wire_round_trip_keeps_values_and_kinds() -> None:
    g = torch.Generator().manual_seed(3)
    value = {
        "t": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "b": torch.tensor([True, False]),
        "h": torch.ones(2, dtype=torch.bfloat16),
        1: (1.5, float("nan"), None, "x"),
        "dtype": torch.float16,
        "size": torch.Size([2, 3]),
    }
    back = wire.decode(wire.loads(wire.dumps({"v": wire.encode(value)}))["v"], lambda d: d)
    assert torch.equal(back["t"], value["t"]) and back["t"].dtype == torch.int64
    assert back["b"].dtype == torch.bool and back["h"].dtype == torch.bfloat16
    assert back[1][0] == 1.5 and math.isnan(back[1][1]) and back[1][2:] == (None, "x")
    assert back["dtype"] is torch.float16 and back["size"] == torch.Size([2, 3])
    generator = wire.decode(wire.encode(g), lambda d: d)
    assert torch.equal(torch.rand(3, generator=generator), torch.rand(3, generator=g))


def test_wire_refuses_objects_and_reads_subclasses_as_plain_tensors() -> None:
    with pytest.raises(wire.WireError, match="cannot be sent"):
        wire.encode(object())
    data = wire.encode(torch.ones(2).as_subclass(Agreeable))
    assert type(wire.decode(data, lambda d: d)) is torch.Tensor


def test_student_names_are_the_cells_free_names() -> None:
    source = "x = build(DecoderBlock)\nlab01.check(x, model, seed=1)\nimport math as m\nm.pi\n"
    assert student_names(source, {"lab01": None}) == ["build", "DecoderBlock", "model"]


# ---------------------------------------------------------------- every judged lab, in-process


@pytest.mark.parametrize("lab", sorted(p.name for p in (REPO / "solutions").iterdir()))
def test_the_solution_passes_every_judged_cell_and_the_release_none(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, lab: str
) -> None:
    monkeypatch.chdir(tmp_path)  # lab 06's Trainer-settings cells write their runs here
    source = nbformat.read(str(REPO / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
    plan = judge_plan(source)
    assert plan and any(cell["hidden"] for cell in plan.values())
    for folder, should_pass in (("solutions", True), ("labs", False)):
        link = InProcessKernel(monkeypatch, answers_namespace(lab, folder))
        for grade_id, cell in plan.items():
            if grade_id in TRAINED_MODEL:
                continue
            verdict = judge_cell(grade_id, cell["source"], JudgeSession(link, timeout=60))
            assert verdict.passed is should_pass, (folder, grade_id, verdict.message)
            if not should_pass:
                assert verdict.message, grade_id


def test_a_module_is_mirrored_and_trains_through_the_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The student's module stays in the kernel; its mirror's parameters get its gradients."""
    namespace = answers_namespace("03_multi_head_attention")
    session = JudgeSession(InProcessKernel(monkeypatch, namespace), timeout=30)
    mha = session.lookup("MultiHeadAttention")(8, 2)
    assert isinstance(mha, torch.nn.Module) and isinstance(mha.q_proj, torch.nn.Linear)
    optimizer = torch.optim.SGD(mha.parameters(), lr=0.1)
    x = torch.randn(2, 3, 8)
    before = mha.q_proj.weight.detach().clone()
    out, _ = mha(x, x, x)
    out.pow(2).sum().backward()
    assert mha.q_proj.weight.grad is not None and mha.q_proj.weight.grad.abs().sum() > 0
    optimizer.step()
    # The step happened on the mirror; the next call runs the kernel's module on it.
    local = namespace["MultiHeadAttention"](8, 2)
    local.load_state_dict(mha.state_dict())
    torch.testing.assert_close(mha(x, x, x)[0], local(x, x, x)[0])
    assert not torch.equal(before, mha.q_proj.weight.detach())


def test_a_call_without_grad_sends_only_the_parameters_that_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under ``no_grad`` the mirror's unchanged parameters go by name, and the kernel's module
    still starts every call from the judge's values (what was sent last is put back)."""
    namespace = answers_namespace("03_multi_head_attention")
    link = InProcessKernel(monkeypatch, namespace)
    session = JudgeSession(link, timeout=30)
    mha = session.lookup("MultiHeadAttention")(16, 2)
    x = torch.randn(2, 3, 16)
    with torch.no_grad():
        first = mha(x, x, x)[0]
        sizes = [len(link.texts[-1])]
        second = mha(x, x, x)[0]
        sizes.append(len(link.texts[-1]))
        # The student's module changed in the kernel behind the judge's back (a thread, say).
        module = next(o for o in kernel._objects.values() if isinstance(o, torch.nn.Module))
        module.q_proj.weight.data.zero_()
        third = mha(x, x, x)[0]
        mha.k_proj.weight.mul_(2.0)  # the judge's own change is sent
        fourth = mha(x, x, x)[0]
        sizes.append(len(link.texts[-1]))
    weights = 4 * 16 * 16 * 4  # bytes of the four projection matrices, sent once
    assert sizes[0] - sizes[1] >= weights and sizes[1] < sizes[2] < sizes[0], sizes
    torch.testing.assert_close(second, first, rtol=0, atol=0)
    torch.testing.assert_close(third, first, rtol=0, atol=0)
    local = namespace["MultiHeadAttention"](16, 2)
    local.load_state_dict(mha.state_dict())
    torch.testing.assert_close(fourth, local(x, x, x)[0])
    assert not torch.allclose(fourth, first)


def test_a_returned_dict_carries_gradients_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Lightning-style ``{"loss": ...}`` crosses the wire differentiably in both directions:
    the judge's backward through the student's call, the student's through a check's."""

    def step(x: torch.Tensor) -> dict[str, Any]:
        return {"loss": (3 * x).sum(), "count": 2}

    def through(check: Any, x: torch.Tensor) -> torch.Tensor:
        x = x.clone().requires_grad_(True)
        check(x)["loss"].backward()
        return x.grad

    link = InProcessKernel(monkeypatch, {"step": step, "through": through})
    session = JudgeSession(link, timeout=10)
    x = torch.randn(4, requires_grad=True)
    out = session.lookup("step")(x)
    assert out["count"] == 2
    out["loss"].backward()
    torch.testing.assert_close(x.grad, torch.full((4,), 3.0))
    grad = session.lookup("through")(lambda t: {"loss": t.pow(2).sum()}, torch.arange(3.0))
    torch.testing.assert_close(grad, 2 * torch.arange(3.0))


def test_both_sides_read_a_result_alike() -> None:
    t, u = torch.ones(1), torch.zeros(2)
    for value, count in [(t, 1), ((t, 3, u), 2), ([u], 1), ({"loss": t, "n": 1}, 1), (7, 0)]:
        tensors, rebuild = wire.result_tensors(value)
        assert len(tensors) == count
        again = rebuild([x + 1 for x in tensors])
        assert type(again) is type(value)
        tensors_again = wire.result_tensors(again)[0]
        assert len(tensors_again) == count
        for now, was in zip(tensors_again, tensors, strict=True):
            assert torch.equal(now, was + 1)
    cache = torch.return_types.max((t, u))  # a structseq goes by reference: no tensors
    assert wire.result_tensors(cache)[0] == []


def test_a_submission_that_zeroes_the_checks_inputs_still_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kernel's writes come back to the judge's tensors, and the check undoes them before
    its oracle runs: zeroing q, k and v cannot make attention on zeros the expected answer."""
    source = (
        "### BEGIN HIDDEN TESTS\n"
        "from transformer_lab.grading.hidden import lab02 as hidden02\n"
        "hidden02.hidden_check_scaled_dot_product_attention(scaled_dot_product_attention, seed=3)\n"
        "### END HIDDEN TESTS\n"
    )
    verdict, _ = _judge(monkeypatch, source, scaled_dot_product_attention=zeroing_attention)
    assert not verdict.passed and "weights of scaled_dot_product_attention" in verdict.message


def test_the_students_writes_into_a_checks_module_come_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    namespace = answers_namespace("03_multi_head_attention")
    session = JudgeSession(InProcessKernel(monkeypatch, namespace), timeout=30)
    from transformer_lab.checks.lab03 import Projections

    ours, theirs = Projections(6, 2, bias=True), torch.nn.MultiheadAttention(6, 2)
    weight = ours.q_proj.weight
    session.lookup("load_torch_weights")(ours, theirs)
    assert ours.q_proj.weight is weight  # copied in place, as the student's code did
    torch.testing.assert_close(weight.detach(), theirs.in_proj_weight.detach()[:6])


def _load_into_projections(monkeypatch: pytest.MonkeyPatch, load: Any) -> tuple[Any, Any, Any]:
    """``load(ours, theirs)`` run in the kernel on a check's modules; both, and the Parameter
    ``ours.q_proj.weight`` was before."""
    session = JudgeSession(InProcessKernel(monkeypatch, {"load": load}), timeout=30)
    from transformer_lab.checks.lab03 import Projections

    ours, theirs = Projections(6, 2, bias=True), torch.nn.MultiheadAttention(6, 2)
    weight = ours.q_proj.weight
    session.lookup("load")(ours, theirs)
    return ours, theirs, weight


def test_a_parameter_the_students_code_replaced_by_a_plain_tensor_comes_back_as_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def load(ours: Any, theirs: Any) -> None:
        w = theirs.in_proj_weight.detach()[:6].clone()
        del ours.q_proj.weight
        ours.q_proj.weight = w

    ours, theirs, weight = _load_into_projections(monkeypatch, load)
    now = ours.q_proj.weight  # what the check reads: the tensor, not a module without one
    assert type(now) is torch.Tensor and now is not weight
    assert "weight" not in dict(ours.q_proj.named_parameters())
    torch.testing.assert_close(now, theirs.in_proj_weight.detach()[:6])
    assert ours.q_proj(torch.ones(1, 6)).shape == (1, 6)  # the layer still runs on it


def test_a_parameter_pointed_at_a_slice_of_a_checks_tensor_shares_its_memory_here_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def load(ours: Any, theirs: Any) -> None:
        ours.k_proj.weight.data = theirs.in_proj_weight.data[6:12]
        ours.out_proj.weight.data = theirs.out_proj.weight.data

    ours, theirs, weight = _load_into_projections(monkeypatch, load)
    assert ours.q_proj.weight is weight
    k, full = ours.k_proj.weight, theirs.in_proj_weight
    assert k.shape == (6, 6) and k.untyped_storage().data_ptr() == full.untyped_storage().data_ptr()
    torch.testing.assert_close(k.detach(), full.detach()[6:12])
    with torch.no_grad():
        full[7, 2] = 123.0  # one memory: a write into torch's tensor shows in ours
    assert k[1, 2].item() == 123.0
    assert ours.out_proj.weight.data_ptr() == theirs.out_proj.weight.data_ptr()


def _forged_changes(changes: Any) -> tuple[torch.nn.Module, Any]:
    """A check's module and what a kernel that replies ``changes`` to a call makes of it."""
    module = torch.nn.Linear(2, 2)
    box: dict[str, Any] = {}

    class Forger:
        def exchange(self, text: str, timeout: float, answer: Any) -> str:
            changed = changes(box["root"])
            return wire.dumps({"ok": True, "value": None, "grader_changes": wire.encode(changed)})

    session = JudgeSession(Forger(), timeout=5)
    box["root"] = session.keep(module)["$gmodule"]
    try:
        return module, session.request({"op": "call", "target": 1})
    except JudgeError as exc:
        return module, exc


W = torch.full((2, 2), 7.0)


@pytest.mark.parametrize(
    "changes",
    [
        lambda root: [[root, [["nothing.weight", W, True, False, None]], [], []]],
        lambda root: [[root, [["weight", "not a tensor", True, False, None]], [], []]],
        lambda root: [[root, [["weight", W.long(), True, True, None]], [], []]],
        lambda root: [
            [root, [["weight", W, True, False, [f"{root}:bias", 0, [2, "x"], [1, 1]]]], [], []]
        ],
        lambda root: [[root, [], [], [["forward", W, False]]]],
        lambda root: [[root, [], [["nothing.bias"]], []]],
        lambda root: [[root, [], []]],
    ],
    ids=[
        "unknown",
        "not_a_tensor",
        "int_requires_grad",
        "bad_view",
        "plain_no_param",
        "bad_removed",
        "short",
    ],
)
def test_a_forged_write_back_scores_zero_with_the_reason(changes: Any) -> None:
    """Nothing a kernel says a call did to a check's module crashes the grader: a name that is
    not a parameter, a value that is not a tensor, a view that is not one."""
    _, result = _forged_changes(changes)
    assert isinstance(result, JudgeError) and "not data the judge reads" in str(result)


def test_a_forged_view_outside_the_shared_tensor_is_kept_as_a_copy() -> None:
    """A ``shares`` that does not lie inside the tensor it names (or holds other values) is not
    made a view: the mirror keeps the values, in memory of its own."""

    def far(root: int) -> Any:
        return [[root, [["weight", W, True, False, [f"{root}:bias", 0, [2, 2], [9, 1]]]], [], []]]

    module, result = _forged_changes(far)
    assert result is None
    assert module.weight.data_ptr() != module.bias.data_ptr()
    assert torch.equal(module.weight.detach(), W)


# ---------------------------------------------------------------- through the real grader

ATTACKS = {
    # The kernel's server rewritten to claim success for every request (the serving loop
    # sends whatever ``serve`` leaves in ``_last``): it can only return other data.
    "forged_reply": (
        "import transformer_lab.judge.kernel as k\n"
        "def serve(text):\n"
        '    k._last = \'{"ok": true, "value": null}\'\n'
        "k.serve = serve"
    ),
    # Comparisons dispatched to the student's object.
    "agreeable_subclass": (
        "class T(torch.Tensor):\n"
        "    @classmethod\n"
        "    def __torch_function__(cls, func, types, args=(), kwargs=None):\n"
        "        if getattr(func, '__name__', '') in ('allclose', 'isclose', 'equal', 'all'):\n"
        "            return True\n"
        "        return super().__torch_function__(func, types, args, kwargs or {})\n"
        "def sinusoidal_encoding(seq_len, d_model, base=10000.0):\n"
        "    return torch.zeros(seq_len, d_model).as_subclass(T)\n"
        "def relative_shift_matrix(offset, d_model, base=10000.0):\n"
        "    return torch.eye(d_model).as_subclass(T)"
    ),
    # Reading the hidden checks: history, the module, its source.
    "read_hidden": (
        "import sys, importlib\n"
        "found = [name for name in sys.modules if 'hidden' in name]\n"
        "try:\n"
        "    importlib.import_module('transformer_lab.grading.hidden.lab01')\n"
        "    found.append('imported')\n"
        "except Exception as exc:\n"
        "    found.append(type(exc).__name__)\n"
        "print('LEAK', found, In)"
    ),
}


def _submission(code: str, where: int) -> nbformat.NotebookNode:
    nb = nbformat.read(str(REPO / "labs" / LAB / f"{LAB}.ipynb"), as_version=4)
    cell = nbformat.v4.new_code_cell(code)
    nb.cells.insert(where if where >= 0 else len(nb.cells), cell)
    return nb


# Graded in lab 01's shared class (with the replays of test_judge_unscanned and
# test_judge_hidden_leaks: one sandboxed run, two jobs, 60 s cells), beside the honest solution.
hand_in(
    __file__,
    LAB,
    {
        student: _submission(code, -1 if student == "read_hidden" else 3)
        for student, code in ATTACKS.items()
    }
    | {"honest": nbformat.read(str(REPO / "solutions" / LAB / f"{LAB}.ipynb"), as_version=4)},
)


@pytest.mark.slow
@needs_bwrap
def test_hostile_submissions_earn_nothing_and_see_nothing(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    course, _ = shared_class(LAB, tmp_path_factory)
    with open(course / "grades.csv", newline="") as handle:
        rows = {row["student_id"]: row for row in csv.DictReader(handle)}
    assert float(rows["honest"]["score"]) == 12.0
    for student in ATTACKS:
        assert float(rows[student]["score"]) == 0.0, student
    # The kernel had no hidden module to import, and its history holds no hidden test.
    executed = nbformat.read(
        str(course / "autograded" / "read_hidden" / LAB / f"{LAB}.ipynb"), as_version=4
    )
    leak = next(c for c in executed.cells if "print('LEAK'" in c.source)
    printed = "".join(o.get("text", "") for o in leak.outputs)
    assert "LEAK ['ModuleNotFoundError']" in printed
    feedback = (course / "feedback" / "read_hidden" / LAB / f"{LAB}.html").read_text()
    for secret in ("hidden_check", "seed=1101", "oracle_", "hidden01"):
        assert secret not in printed and secret not in feedback, secret
