"""Tests of the shared check helpers (transformer_lab.checks._common): messages and bans."""

from __future__ import annotations

import functools
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer_lab.checks._common import (
    Ban,
    ForbiddenCallError,
    call_forbidding,
    call_student,
    close,
    compare,
    expect_close,
    expect_module,
    expect_shape,
    expect_true,
    forbidden,
    generator,
    randint,
)
from transformer_lab.judge import bans as _bans


def test_expect_shape_names_a_transpose_and_missing_axes() -> None:
    expect_shape(torch.zeros(3, 4), (3, None), "x")
    with pytest.raises(AssertionError, match=r"x has shape \(4, 3\), expected \(3, 4\).*transpose"):
        expect_shape(torch.zeros(4, 3), (3, 4), "x")
    with pytest.raises(AssertionError, match="one dimension is missing"):
        expect_shape(torch.zeros(3), (3, 4), "x")
    with pytest.raises(AssertionError, match="extra dimension"):
        expect_shape(torch.zeros(3, 4, 1), (3, 4), "x")
    with pytest.raises(AssertionError, match="forget to `return`"):
        expect_shape(None, (3,), "x")


def test_expect_close_reports_where_and_hint() -> None:
    want = torch.zeros(2, 3)
    got = want.clone()
    got[1, 2] = 0.5
    with pytest.raises(AssertionError) as info:
        expect_close(got, want, "f(2, 3)", hint="Did you add one?")
    msg = str(info.value)
    assert "1 of 6 entries" in msg and "(1, 2)" in msg and "Did you add one?" in msg
    expect_close(want + 1e-7, want, "f")
    with pytest.raises(AssertionError, match="NaN at index"):
        expect_close(torch.tensor([0.0, float("nan")]), torch.zeros(2), "g")
    with pytest.raises(AssertionError, match=r"dtype torch\.int64"):
        expect_close(torch.zeros(2, dtype=torch.long), torch.zeros(2), "g")


def test_expect_true_survives_optimisation_flags() -> None:
    expect_true(True, "never shown")
    with pytest.raises(AssertionError, match="shown"):
        expect_true(False, "shown")
    # Under `python -O` a bare `assert` vanishes; expect_true must still raise.
    code = (
        "from transformer_lab.checks._common import expect_true\n"
        "assert False, 'bare asserts are stripped'\n"
        "expect_true(False, 'still raised under -O')\n"
    )
    run = subprocess.run(
        [sys.executable, "-O", "-c", code], capture_output=True, text=True, timeout=120
    )
    assert run.returncode != 0
    assert "still raised under -O" in run.stderr
    assert "bare asserts are stripped" not in run.stderr


def test_call_student_translates_exceptions() -> None:
    def todo() -> None:
        raise NotImplementedError()

    def broken() -> None:
        [][1]

    with pytest.raises(AssertionError, match="not implemented yet"):
        call_student(todo, what="todo()")
    with pytest.raises(AssertionError, match=r"broken\(\) raised IndexError"):
        call_student(broken, what="broken()")
    with pytest.raises(AssertionError, match="expected a function"):
        call_student(3, what="x")
    assert call_student(lambda a, b=1: a + b, 1, b=2) == 3


def _package_like(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _decorated(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    return wrapper


@_decorated
def _closure_target(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def test_forbidden_catches_aliases_of_python_functions() -> None:
    alias = _package_like

    def student(x: torch.Tensor) -> torch.Tensor:
        return alias(x)

    ban = Ban(functions=(_package_like, _closure_target))
    with pytest.raises(ForbiddenCallError, match="_package_like"), forbidden(ban):
        student(torch.ones(2))
    assert torch.equal(_package_like(torch.ones(2)), torch.full((2,), 2.0))
    with pytest.raises(ForbiddenCallError, match="_closure_target"), forbidden(ban):
        _closure_target(torch.ones(1))
    assert torch.equal(_closure_target(torch.ones(1)), torch.full((1,), 2.0))
    assert sys.getprofile() is None


def test_the_judges_side_records_a_ban_and_the_kernels_side_enforces_it() -> None:
    """Under the judge (``forwarded``) a ban is only recorded for the kernel: no banned name is
    imported, no profiler set; the kernel's side of a call (``enforced_here``) refuses again."""
    ban = Ban(functions=(_package_like, "transformer_lab.no_such_module.answer"), ops=("add",))
    with _bans.forwarded(), forbidden(ban):
        assert _bans.active_ban() is not None and sys.getprofile() is None
        assert torch.equal(_package_like(torch.ones(2)), torch.full((2,), 2.0))
        refused = pytest.raises(ForbiddenCallError, match="_package_like")
        with refused, _bans.enforced_here(), forbidden(ban):
            _package_like(torch.ones(2))
    assert _bans.active_ban() is None and sys.getprofile() is None


def test_forbidden_detects_a_swallowed_call() -> None:
    def sneaky(x: torch.Tensor) -> torch.Tensor:
        try:
            return _package_like(x)
        except Exception:
            return x * 2

    with (
        pytest.raises(ForbiddenCallError, match="caught inside your code"),
        forbidden(Ban(functions=(_package_like,))),
    ):
        sneaky(torch.ones(2))


SAVED_SOFTMAX = torch.softmax  # a student's alias taken before any check runs


@pytest.mark.parametrize(
    ("call", "family"),
    [
        (lambda x: torch.softmax(x, -1), "softmax"),
        (lambda x: SAVED_SOFTMAX(x, -1), "softmax"),
        (lambda x: x.softmax(-1), "softmax"),
        (lambda x: F.softmax(x, -1), "softmax"),
        (lambda x: F.log_softmax(x, -1).exp(), "softmax"),
        (lambda x: torch._softmax(x, -1, False), "softmax"),
        (lambda x: F.scaled_dot_product_attention(x[None], x[None], x[None]), "attention"),
        (lambda x: F.layer_norm(x, (4,)), "normalization"),
        # The shortcut the issue found: group norm with one group is layer norm.
        (lambda x: F.group_norm(x.reshape(-1, 4), 1), "normalization"),
        (lambda x: nn.LayerNorm(4)(x), "normalization"),
    ],
)
def test_forbidden_refuses_every_spelling_of_an_operation(call, family: str) -> None:
    x = torch.randn(3, 4)
    before = call(x)
    ban = Ban(ops=(family,), reason="write your own")
    refused = r"which this exercise does not allow.*your own"
    with pytest.raises(ForbiddenCallError, match=refused), forbidden(ban):
        call(x)
    # Everything works again afterwards, and what is allowed works inside.
    torch.testing.assert_close(call(x), before)
    with forbidden(ban):
        torch.testing.assert_close(torch.exp(x), x.exp())
        torch.testing.assert_close((x - x.logsumexp(-1, keepdim=True)).exp().sum(-1), torch.ones(3))


def test_forbidden_rejects_unknown_targets() -> None:
    with (
        pytest.raises(ImportError, match="cannot import"),
        forbidden(Ban(functions=("no_mod.fn",))),
    ):
        pass
    with forbidden(Ban(functions=("transformer_lab.attention.no_such_function",))):
        pass  # a kit name an older install lacks is skipped


def test_forbidden_kit_class_disables_its_methods() -> None:
    from transformer_lab.positional import SinusoidalPositionalEncoding

    with (
        pytest.raises(ForbiddenCallError, match="SinusoidalPositionalEncoding"),
        forbidden(Ban(functions=(SinusoidalPositionalEncoding,))),
    ):
        SinusoidalPositionalEncoding(8, max_len=4)
    assert SinusoidalPositionalEncoding(8, max_len=4)(torch.zeros(1, 3, 8)).shape == (1, 3, 8)


def test_forbidden_torch_module_class() -> None:
    mha = nn.MultiheadAttention(4, 2, batch_first=True)
    x = torch.randn(1, 3, 4)
    with (
        pytest.raises(ForbiddenCallError, match="MultiheadAttention"),
        forbidden(Ban(functions=("torch.nn.MultiheadAttention",))),
    ):
        mha(x, x, x)


def test_close_compares_across_float_dtypes_and_never_matches_nan() -> None:
    a = torch.tensor([1.0, 2.0])
    assert close(a, a.double() + 1e-6)
    assert not close(a, a + 1e-2)
    assert not close(a, torch.tensor([1.0, 2.0, 3.0]))
    nan = torch.tensor([float("nan"), 2.0])
    assert not close(nan, nan)


def test_compare_names_the_matching_candidate_or_falls_back_to_the_hint() -> None:
    want = torch.tensor([1.0, 2.0, 3.0])
    assert compare(want.clone(), want, what="f(x)", hint="generic") is not None
    wrong = want * 2
    cands = [(None, "not applicable"), (wrong + 5, "adds five"), (wrong, "doubles")]
    with pytest.raises(AssertionError, match="doubles") as info:
        compare(wrong.clone(), want, what="f(x)", candidates=cands, hint="generic")
    assert "generic" not in str(info.value)
    with pytest.raises(AssertionError, match="generic"):
        compare(want + 1, want, what="f(x)", candidates=cands, hint="generic")
    # NaNs the oracle lacks: a candidate with NaNs in the same places is named, and the advice
    # survives expect_close's own NaN wording.
    got = torch.tensor([float("nan"), 4.0, 6.0])
    cands = [(torch.tensor([float("nan"), 4.0, 6.0]), "divides by zero somewhere")]
    with pytest.raises(AssertionError, match=r"NaN.*divides by zero somewhere"):
        compare(got, want, what="f(x)", candidates=cands, hint="generic")


def test_a_write_into_an_argument_is_undone_or_named() -> None:
    """A check's tensors come back as they went in (an oracle computed after the call still
    sees its inputs); a returned written input keeps the student's values; ``in_place`` names
    the write as the mistake instead."""

    def halve(x: torch.Tensor, scratch: list[torch.Tensor]) -> torch.Tensor:
        scratch[0].fill_(float("nan"))
        return x.div_(2)

    x, scratch = torch.tensor([2.0, 4.0]), [torch.zeros(3)]
    got = call_student(halve, x, scratch, what="halve(x)")
    assert torch.equal(got, torch.tensor([1.0, 2.0])) and torch.equal(x, torch.tensor([2.0, 4.0]))
    assert torch.equal(scratch[0], torch.zeros(3))
    with pytest.raises(AssertionError, match=r"^halve\(x\) changed x: copy it"):
        call_student(halve, x, scratch, what="halve(x)", in_place="changed x: copy it")
    assert torch.equal(x, torch.tensor([2.0, 4.0]))  # a named write is undone as well
    nan = torch.tensor([float("nan"), 1.0])  # a NaN left as it was is no write
    assert call_student(lambda t: t.sum(), nan, what="sum", in_place="wrote") is not None
    resized = torch.ones(2, 2)
    call_student(lambda t: t.resize_(1), resized, what="resize")
    assert torch.equal(resized, torch.ones(2, 2))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_write_is_undone_or_named(dtype: torch.dtype) -> None:
    """The undo compares bytes, not float32 values: a write of a half-precision argument
    (the bf16-mixed path) is found and undone, and a NaN or -0.0 left in place is no write."""
    x = torch.tensor([1.5, float("nan"), -0.0], dtype=dtype)
    kept = x.clone()

    def nudge(t: torch.Tensor) -> torch.Tensor:
        t[0] = t[0] + torch.finfo(dtype).eps  # the smallest change this dtype can hold
        return t.sum()

    call_student(nudge, x, what="nudge")
    assert x.dtype == dtype and torch.equal(x.view(torch.int16), kept.view(torch.int16))
    with pytest.raises(AssertionError, match=r"^nudge wrote into x"):
        call_student(nudge, x, what="nudge", in_place="wrote into x")
    assert torch.equal(x.view(torch.int16), kept.view(torch.int16))
    assert call_student(lambda t: t * 2, x, what="double", in_place="wrote") is not None


def test_call_forbidding_disables_the_bans_and_adds_advice_to_crashes() -> None:
    def cheat(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, -1)

    def crash(x: torch.Tensor) -> torch.Tensor:
        raise IndexError("boom")

    x = torch.randn(3)
    ban = Ban(ops=("softmax",), reason="own softmax")
    with pytest.raises(ForbiddenCallError, match=r"torch\.softmax.*\(own softmax\)"):
        call_forbidding(cheat, (x,), {}, ban=ban, what="f(x)")
    torch.testing.assert_close(torch.softmax(x, -1), torch.exp(x) / torch.exp(x).sum())
    with pytest.raises(AssertionError, match=r"f\(x\) raised IndexError: boom Check the index"):
        call_forbidding(crash, (x,), {}, ban=ban, what="f(x)", on_error="Check the index.")
    got = call_forbidding(torch.add, (x,), {"other": 1.0}, ban=ban, what="add")
    torch.testing.assert_close(got, x + 1.0)


def test_expect_module_and_seeded_helpers() -> None:
    layer = nn.Linear(2, 2)
    assert expect_module(layer, "Linear(2, 2)") is layer
    with pytest.raises(AssertionError, match=r"inherit from nn\.Module"):
        expect_module(object(), "Thing()")
    draws = [randint(2, 4, generator(0)) for _ in range(3)]
    assert draws == [randint(2, 4, generator(0))] * 3
    g = generator(1)
    seen = {randint(2, 4, g) for _ in range(200)}
    assert seen == {2, 3, 4}


def test_expect_close_compares_infinities_exactly() -> None:
    inf = float("inf")
    expect_close(torch.tensor([1.0, -inf]), torch.tensor([1.0, -inf]), "filtered logits")
    for wrong in ([1.0, inf], [1.0, 5.0]):
        with pytest.raises(AssertionError, match="wrong at 1 of 2"):
            expect_close(torch.tensor(wrong), torch.tensor([1.0, -inf]), "filtered logits")
