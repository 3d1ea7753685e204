"""One diagnosis, the right one: every catalogued mistake is named alone, and first.

The catalogues of typical mistakes live in ``tests/test_labNN_checks.py`` (each entry: a wrong
answer, the checks it must fail, words their messages must hold); ``mistake_catalogue`` lists
them. For
every entry of labs 01-08 and every check it fails, the message must name that
mistake (the hint recorded by ``note_mistake``, when the check names mistakes by running
variants), hold no " Or: " list of alternatives (the checks' inputs tell the catalogue's
mistakes apart), and not call it "not one of the typical mistakes" unless the catalogue says
it is none. The shared helper itself (:func:`~transformer_lab.checks._common.diagnose`) is
tested on tiny cases: a mistake must match on EVERY input tried, two are listed only when they
agree on every input, and a wrong answer no mistake explains is shown at its smallest input.
Lab 02's NaN (a softmax without the max subtraction, not the fill), lab 08's bad temperature
(blamed on the sampling, not on the cache) and the judge's recorded mistake are tested too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import test_lab02_checks as t02
import test_lab07_checks as t07
import test_lab08_checks as t08
import torch
from judge_support import InProcessKernel
from mistake_catalogue import ENTRIES, Words

from transformer_lab.checks import lab07, lab08
from transformer_lab.checks._common import NOT_TYPICAL, Case, diagnose, named_mistakes
from transformer_lab.grading.judge import JudgeSession, judge_cell

# Entries whose words do not single out one hint of the catalogue: the words of the hint meant.
SPECIFIC = {
    "lab07 bpe_train words_of=chain": "count pairs inside each word only",
    "lab07 bpe_train words_of=spaces": "spaces are symbols of one long sequence",
}
# Entries whose message names the function at fault while the mistake recorded is the rule.
RECORDED = {
    "lab08 generate sampling=divide": "Temperature 0 means greedy decoding",
    "lab08 generate sampling=helper": "Temperature 0 means greedy decoding",
}
# Entries the catalogue itself calls no typical mistake (their message says so).
NOT_TYPICAL_ENTRIES = {"lab07 top_p top_p_sums_to_one_early", "lab07 top_k top_k_exact"}


@pytest.mark.filterwarnings("ignore:The use of `x.T`")
@pytest.mark.parametrize(
    ("checks", "answer", "failing", "words", "generic"),
    [(e.checks, e.answer, e.failing, e.words, e.generic) for e in ENTRIES],
    ids=[e.id for e in ENTRIES],
)
def test_each_catalogued_mistake_gets_one_diagnosis_naming_it_first(
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    checks: Mapping[str, Callable[[Any], Any]],
    answer: Any,
    failing: list[str],
    words: Words,
    generic: tuple[str, ...],
) -> None:
    monkeypatch.chdir(tmp_path)  # a wrong train_translator's own logger writes here
    entry = request.node.callspec.id
    for name in failing:
        said = words if isinstance(words, str) else words[name]
        specific = SPECIFIC.get(entry, said)
        named_mistakes()  # forget what an earlier check named
        try:
            checks[name](answer)
        except AssertionError as exc:
            message = str(exc)
        else:
            pytest.fail(f"{name} passed")
        named = named_mistakes()
        assert " Or: " not in message, (name, message)
        if name in generic:  # the catalogue says this check cannot name the mistake
            continue
        assert said.lower() in message.lower(), (name, message)
        assert specific.lower() in message.lower(), (name, message)
        if entry in NOT_TYPICAL_ENTRIES:
            assert NOT_TYPICAL in message, (name, message)
            continue
        assert NOT_TYPICAL not in message, (name, message)
        if named:  # named by running the catalogue's variants: that mistake, and it alone
            assert len(set(named)) == 1, (name, named)  # one mistake (a check may note it twice)
            recorded = RECORDED.get(entry, specific)
            assert recorded.lower() in named[0].lower(), (name, named, message)
            assert named[0] in message, (name, message)


# --------------------------------------------------------------------------------------
# The shared helper on tiny cases
# --------------------------------------------------------------------------------------


def _equal(a: Any, b: Any) -> bool:
    return a == b


def _diagnosis(cases: list[Case[Any]]) -> tuple[str, list[str]]:
    named_mistakes()
    with pytest.raises(AssertionError) as info:
        diagnose(
            cases,
            same=_equal,
            describe=lambda c: f"f({c.input}) returned {c.got}, expected {c.want}.",
            rule="f doubles its input.",
        )
    return str(info.value), named_mistakes()


def test_a_mistake_is_named_only_when_it_matches_on_every_input() -> None:
    # "plus one" matches the first input only; "squares" matches both (2*2 = 2**2 at x=2).
    cases = [
        Case(3, "f(3)", 9, 6, {"plus one": 9, "squares": 9}, size=3),
        Case(2, "f(2)", 4, 4, {"plus one": 3, "squares": 4}, size=2),
    ]
    message, named = _diagnosis(cases)
    assert named == ["squares"]
    assert message == "f(3) returned 9, expected 6. squares"


def test_or_only_lists_mistakes_identical_on_every_input() -> None:
    cases = [
        Case(3, "f(3)", 9, 6, {"squares": 9, "times three": 9, "plus three": 6}, size=3),
        Case(0, "f(0)", 0, 0, {"squares": 0, "times three": 0, "plus three": 3}, size=0),
    ]
    message, named = _diagnosis(cases)
    assert message.endswith("squares Or: times three")
    assert named == ["squares"]


def test_no_typical_mistake_shows_the_smallest_failing_input() -> None:
    cases = [
        Case(30, "f(30)", 1, 60, {"squares": 900}, size=30),
        Case(5, "f(5)", 1, 10, {"squares": 25}, size=5),
        Case(1, "f(1)", 2, 2, {"squares": 1}, size=1),  # right here: not the one shown
    ]
    message, named = _diagnosis(cases)
    assert named == []
    assert message == f"f(5) returned 1, expected 10. {NOT_TYPICAL} f doubles its input."


def test_a_mistake_absent_from_an_input_gives_the_expected_output_there() -> None:
    # Stored examples keep only the mistakes that differ: "squares" is right at x=2.
    cases = [
        Case(3, "f(3)", 9, 6, {"squares": 9}, size=3),
        Case(2, "f(2)", 4, 4, {}, size=2),
    ]
    assert _diagnosis(cases)[1] == ["squares"]


# --------------------------------------------------------------------------------------
# Lab 07: what the messages show
# --------------------------------------------------------------------------------------


def top_p_drops_the_last_kept(logits: torch.Tensor, p: float) -> torch.Tensor:
    """No typical mistake: the right nucleus, less the least likely token kept (if two)."""
    out = t07.top_p(logits, p)
    kept = ~torch.isneginf(out)
    rows = out.reshape(-1, out.shape[-1]).clone()
    for row, keep in zip(rows, kept.reshape(-1, out.shape[-1]), strict=True):
        if int(keep.sum()) > 1:
            ids = keep.nonzero().flatten()
            row[ids[row[ids].argmin()]] = float("-inf")
    return rows.reshape(out.shape)


def test_no_typical_top_p_mistake_shows_the_smallest_failing_input_in_its_own_shape() -> None:
    with pytest.raises(AssertionError) as info:
        lab07.check_top_p_filter(top_p_drops_the_last_kept)
    message = str(info.value)
    assert NOT_TYPICAL in message
    # The smallest failing example is the 1-D row of 4 logits at p=0.65: its values, and what
    # came back against what was expected (to 3 digits, -inf where a token is removed), flat.
    assert "top_p_filter(logits (4,), p=0.65) with logits = [" in message
    assert "returned [-0.393, -inf, -inf, -inf], expected [-0.393, -inf, -1.086, -inf]." in message
    assert "[[" not in message


def test_a_1d_top_p_mistake_prints_1d_values() -> None:
    with pytest.raises(AssertionError) as info:
        lab07.check_top_p_filter(t07.top_p_drops_crossing)
    message = str(info.value)
    assert "(4,)" in message and "returned [-0.393, -inf, -inf, -inf]" in message
    assert "[[" not in message


def test_the_values_shown_follow_the_shape_of_the_logits() -> None:
    with pytest.raises(AssertionError) as info:
        t07.TOP_P_CHECKS["edges"](t07.top_p_sums_to_one_early)
    message = str(info.value)
    assert (
        "(1, 5), p=1.0) with logits = [[30.0, 10.0, 9.0, 9.0, -1.0]] returned [[30.0, -inf"
        in message
    )


# --------------------------------------------------------------------------------------
# Lab 02: a NaN is blamed on what the code does
# --------------------------------------------------------------------------------------


def _message(check: Callable[[Any], Any], fn: Any) -> str:
    with pytest.raises(AssertionError) as info:
        check(fn)
    return str(info.value)


@pytest.mark.parametrize("fn", [t02.sdpa_softmax_no_max, t02.sdpa_half_overflow])
def test_a_softmax_without_the_max_is_blamed_not_the_fill(fn: Any) -> None:
    # Both fill with the dtype's own minimum, as the fill advice says: the NaN of an empty row
    # is 0/0 from exp(finfo.min) = 0 (float32 and float16), or exp overflowing (float16).
    message = _message(t02.A_MASK, fn)
    assert "Your softmax overflows" in message
    assert "fill masked scores with" not in message and "row of -inf" not in message
    if fn is t02.sdpa_half_overflow:  # right in float32: the float16 example is the one shown
        assert "float16" in message


@pytest.mark.parametrize("mode", ["nan", "where_1e9"])
def test_a_minus_inf_fill_is_still_blamed_on_the_fill(mode: str) -> None:
    message = _message(t02.A_HID_MASK, t02._variant_sdpa(mask_mode=mode))
    assert "rows where the mask allows no key" in message
    assert "Your softmax overflows" not in message


# --------------------------------------------------------------------------------------
# Lab 08: a bad temperature is blamed on the sampling
# --------------------------------------------------------------------------------------


def test_a_temperature_nan_is_blamed_on_the_sampling_not_the_cache() -> None:
    fn = t08.make_generate(sampling="helper")
    with pytest.raises(AssertionError) as info:
        lab08.check_generate(fn)
    message = str(info.value)
    assert "probability tensor contains either `inf`, `nan`" in message
    assert "Temperature 0 means greedy decoding" in message
    assert "Crop the prompt" not in message and "KV cache" not in message


def test_a_multinomial_failure_seen_from_outside_is_blamed_on_the_sampling() -> None:
    # Under the grader's judge the student's operations run in the kernel: only the error
    # comes back. It still points at the sampling step, not at cropping or the cache.
    def generate(model, idx, max_new_tokens, **options):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")

    named_mistakes()
    with pytest.raises(AssertionError) as info:
        lab08.run_generate(generate, lab08.ScriptedLM(), torch.tensor([[1]]), 2, "generate(...)",
                           temperature=0.0)  # fmt: skip
    message = str(info.value)
    assert "Temperature 0 means greedy" in message
    assert "Crop the prompt" not in message
    assert named_mistakes() == [lab08.SPEC.mistake("generate sampling=divide").hint]


# --------------------------------------------------------------------------------------
# Under the grader's judge (the student's code in a stand-in kernel)
# --------------------------------------------------------------------------------------


def _judged(monkeypatch: pytest.MonkeyPatch, source: str, **names: Any) -> Any:
    link = InProcessKernel(monkeypatch, dict(names))
    return judge_cell("test_cell", source, JudgeSession(link, timeout=10))


def test_a_judged_lab07_verdict_records_the_one_mistake(monkeypatch: pytest.MonkeyPatch) -> None:
    verdict = _judged(
        monkeypatch,
        "lab07.check_top_p_filter(top_p_filter)\n",
        top_p_filter=t07.top_p_drops_crossing,
    )
    assert not verdict.passed and " Or: " not in verdict.message
    assert verdict.mistake == "You drop the token that crosses p; keep it"


def test_a_judged_temperature_nan_is_blamed_on_the_sampling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    verdict = _judged(
        monkeypatch,
        "lab08.check_generate(generate)\n",
        generate=t08.make_generate(sampling="helper"),
    )
    assert not verdict.passed
    assert "Temperature 0 means greedy decoding" in verdict.message, verdict.message
    assert "Crop the prompt" not in verdict.message
    assert verdict.mistake.startswith("Temperature 0 means greedy decoding")


@pytest.mark.parametrize(
    ("part", "fn", "words"),
    [("training_flops", fn, words) for fn, words in t08.FLOPS_MISTAKES]
    + [("gpu_days", fn, words) for fn, words in t08.DAYS_MISTAKES],
    ids=lambda value: getattr(value, "__name__", None),
)
def test_a_judged_hidden_scale_cell_names_the_mistake(
    monkeypatch: pytest.MonkeyPatch, part: str, fn: Any, words: str
) -> None:
    """A hidden cell's message holds fixed words only, and the mistake its check recorded: a
    scale function's hidden check records the one it names (gpu_days once said only "a property
    the hidden check tests does not hold")."""
    link = InProcessKernel(monkeypatch, {part: fn})
    source = (
        "from transformer_lab.grading.hidden import lab08 as hidden08\n"
        f"hidden08.hidden_check_{part}({part}, seed=8601)\n"
    )
    verdict = judge_cell("test_cell", source, JudgeSession(link, timeout=10, hidden=True))
    assert not verdict.passed
    assert verdict.message.startswith(f"A hidden check of `{part}` failed"), verdict.message
    assert words in verdict.message, verdict.message


# --------------------------------------------------------------------------------------
# Issue 40: what a symptom check says where a named mistake causes the symptom
# --------------------------------------------------------------------------------------


def test_a_shared_layer_norm_is_mirrored_as_the_alias_it_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import test_lab04_checks as t04

    verdict = _judged(
        monkeypatch,
        "lab04.check_encoder_block(EncoderBlock)\n",
        EncoderBlock=t04.block_with(mistake="shared_norm"),
    )
    assert not verdict.passed
    assert "norm1 and EncoderBlock(8, 2, 16).norm2 are one and the same LayerNorm" in (
        verdict.message
    ), verdict.message
    for internal in ("MirrorModule", "Remote", "GraderModule", "has no attribute"):
        assert internal not in verdict.message, verdict.message


def test_a_missing_attribute_names_the_students_class_not_the_mirror(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class NoNorms(torch.nn.Module):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__()
            self.ff = torch.nn.Linear(2, 2)

    verdict = _judged(
        monkeypatch, "lab04.check_encoder_block(EncoderBlock)\n", EncoderBlock=NoNorms
    )
    assert not verdict.passed
    assert "has no attribute(s) self_attn, norm1, norm2" in verdict.message, verdict.message
    assert "MirrorModule" not in verdict.message


def test_an_inverted_mask_filled_with_minus_inf_is_named_not_the_softmax() -> None:
    message = _message(t02.A_MASK, t02.sdpa_inverted_minus_inf)
    assert "mask inverted" in message.lower(), message
    assert "Your softmax overflows" not in message


def test_a_bessel_corrected_norm_inside_the_block_is_named() -> None:
    import test_lab04_checks as t04

    from transformer_lab.checks import lab04

    block = t04.block_with(mistake="bessel_norm")
    message = _message(lab04.check_encoder_block, block)
    assert "Bessel's correction" in message and "Expected post-norm" not in message, message
