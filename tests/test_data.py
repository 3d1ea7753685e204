"""Synthetic tasks, the sentence grammar and their DataModules: seeding, splits, batch contract."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from transformer_lab.data import (
    BOS_ID,
    EOS_ID,
    IGNORE_INDEX,
    PAD_ID,
    GrammarDataModule,
    SyntheticDataModule,
    make_addition,
    make_sequence_task,
    make_split,
    split_generator,
)
from transformer_lab.data.grammar import (
    NOUNS,
    VERBS,
    GrammarConfig,
    agreement_probes,
    english_vocabulary,
    grammar_text,
    make_grammar_lm,
    make_grammar_translation,
    sample_sentences,
    target_vocabulary,
)

SEQ_CASES = [(t, f) for t in ("copy", "reverse", "sort") for f in ("tagging", "seq2seq")]
ADD_CASES = [("addition", "seq2seq"), ("addition", "lm")]
ALL_CASES = SEQ_CASES + ADD_CASES
ENGLISH_VERBS = {w for verb in VERBS for w in verb[:3]}


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _rows(data: dict[str, torch.Tensor]) -> set[tuple[int, ...]]:
    key = data["src"] if "src" in data else data["tokens"]
    return {tuple(r) for r in key.tolist()}


# ----------------------------------------------------------------------------- task semantics


@pytest.mark.parametrize("min_len", [None, 3])
def test_tagging_targets_are_the_task_answer(min_len: int | None) -> None:
    for task in ("copy", "reverse", "sort"):
        d = make_sequence_task(
            task, 50, seq_len=8, num_symbols=5, min_len=min_len, generator=_gen()
        )
        for tokens, mask, targets in zip(d["tokens"], d["padding_mask"], d["targets"], strict=True):
            real = tokens[mask].tolist()
            assert all(3 <= t < 8 for t in real)
            assert (tokens[~mask] == PAD_ID).all() and (targets[~mask] == IGNORE_INDEX).all()
            expected = {"copy": real, "reverse": real[::-1], "sort": sorted(real)}[task]
            assert targets[mask].tolist() == expected


def test_majority_label_by_counting() -> None:
    d = make_sequence_task("majority", 200, seq_len=9, num_symbols=4, min_len=3, generator=_gen())
    assert d["targets"].shape == (200,)
    for tokens, mask, label in zip(d["tokens"], d["padding_mask"], d["targets"], strict=True):
        counts = Counter(tokens[mask].tolist())
        best = max(counts.values())
        assert int(label) == min(t for t, c in counts.items() if c == best)


def test_majority_datamodule_gives_sequence_labels() -> None:
    dm = SyntheticDataModule(task="majority", num_train=64, num_val=16, batch_size=8)
    batch = next(iter(dm.train_dataloader()))
    assert batch["tokens"].shape == (8, 16) and batch["targets"].shape == (8,)
    assert batch["targets"].min() >= 3 and batch["targets"].max() < dm.num_classes
    with pytest.raises(ValueError, match="format='seq2seq'"):
        SyntheticDataModule(task="majority", format="seq2seq")


def test_variable_lengths_really_vary() -> None:
    d = make_sequence_task("reverse", 200, seq_len=8, min_len=2, generator=_gen())
    lengths = d["padding_mask"].sum(1)
    assert lengths.min() == 2 and lengths.max() == 8
    assert d["padding_mask"][:, 0].all()  # right padding: real tokens come first


def test_seq2seq_layout_bos_answer_eos() -> None:
    d = make_sequence_task("reverse", 40, seq_len=6, min_len=2, format="seq2seq", generator=_gen())
    for i in range(40):
        src = d["src"][i][d["src_padding_mask"][i]].tolist()
        n = len(src)
        tgt_in, tgt_out = d["tgt_in"][i].tolist(), d["tgt_out"][i].tolist()
        assert tgt_in[: n + 1] == [BOS_ID, *src[::-1]]
        assert tgt_out[: n + 1] == [*src[::-1], EOS_ID]
        assert set(tgt_in[n + 1 :]) <= {PAD_ID} and set(tgt_out[n + 1 :]) <= {PAD_ID}
        assert d["tgt_padding_mask"][i].tolist() == [True] * (n + 1) + [False] * (6 - n)
        # Teacher forcing: the decoder input is the output shifted right by one.
        assert tgt_in[1 : n + 1] == tgt_out[:n]


def _number(ids: list[int]) -> int:
    return int("".join(str(i - 3) for i in ids))


def test_addition_seq2seq_is_correct_arithmetic() -> None:
    d = make_addition(100, num_digits=3, generator=_gen(), format="seq2seq")
    assert d["src"].shape == (100, 7) and d["tgt_out"].shape == (100, 5)
    plus = 3 + 10
    for i in range(100):
        src = d["src"][i][d["src_padding_mask"][i]].tolist()
        cut = src.index(plus)
        a, b = _number(src[:cut]), _number(src[cut + 1 :])
        out = d["tgt_out"][i].tolist()
        assert _number(out[: out.index(EOS_ID)]) == a + b


def test_addition_lm_scores_only_the_answer() -> None:
    d = make_addition(100, num_digits=2, generator=_gen(), format="lm")
    tokens, targets = d["tokens"], d["targets"]
    assert tokens.shape == targets.shape == (100, 10)
    for i in range(100):
        row = tokens[i].tolist()
        assert row[0] == BOS_ID
        equals = row.index(3 + 11)
        scored = (targets[i] != IGNORE_INDEX).nonzero().flatten().tolist()
        # Scoring starts at "=" (which predicts the first answer digit) and ends at EOS.
        assert scored[0] == equals and targets[i, scored[-1]] == EOS_ID
        assert scored == list(range(scored[0], scored[-1] + 1))
        # Every scored target is the next input token (a genuine shift by one).
        for p in scored[:-1]:
            assert targets[i, p] == tokens[i, p + 1]
        q = row[1:equals]
        cut = q.index(3 + 10)
        answer = targets[i, scored[:-1]].tolist()
        assert _number(answer) == _number(q[:cut]) + _number(q[cut + 1 :])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"task": "rotate"}, "task='rotate'"),
        ({"task": "reverse", "format": "lm"}, "format='lm'"),
        ({"task": "addition", "format": "tagging"}, "format='tagging'"),
        ({"task": "copy", "num_symbols": 0}, "num_symbols=0"),
        ({"task": "copy", "seq_len": 0}, "seq_len=0"),
        ({"task": "copy", "batch_size": 0}, "batch_size=0"),
        ({"task": "copy", "seq_len": 4, "min_len": 5}, "min_len=5"),
        ({"task": "addition", "format": "lm", "num_digits": 0}, "num_digits=0"),
    ],
)
def test_bad_arguments_name_the_values(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SyntheticDataModule(**kwargs)


# ----------------------------------------------------------------------------- seeding, splits


@pytest.mark.parametrize(("task", "fmt"), ALL_CASES)
def test_same_seed_same_data_different_seed_different(task: str, fmt: str) -> None:
    def split(seed: int, name: str = "train") -> dict[str, torch.Tensor]:
        return make_split(task, 64, seed=seed, split=name, format=fmt)

    a, b, c = split(0), split(0), split(1)
    for key in a:
        torch.testing.assert_close(a[key], b[key])
    assert not torch.equal(a[next(iter(a))], c[next(iter(c))])
    assert not torch.equal(a[next(iter(a))], split(0, "val")[next(iter(a))])


def test_data_does_not_depend_on_global_rng() -> None:
    torch.manual_seed(123)
    a = make_split("reverse", 32, seed=0, split="train", format="tagging")
    torch.manual_seed(456)
    torch.rand(10)
    b = make_split("reverse", 32, seed=0, split="train", format="tagging")
    torch.testing.assert_close(a["tokens"], b["tokens"])
    assert split_generator(0, "train").initial_seed() != split_generator(0, "val").initial_seed()


@pytest.mark.parametrize(("task", "fmt"), [*ALL_CASES, ("majority", "tagging")])
def test_validation_is_disjoint_from_training(task: str, fmt: str) -> None:
    kw = {"num_digits": 1} if task == "addition" else {"seq_len": 3, "num_symbols": 3}
    # Small spaces (27 sequences, 100 sums) make clashes certain without the filter.
    dm = SyntheticDataModule(task=task, format=fmt, num_train=12, num_val=10, **kw)
    dm.setup()
    assert _rows(dm.train_data).isdisjoint(_rows(dm.val_data))
    assert len(dm.val_data[next(iter(dm.val_data))]) == 10


def test_too_small_task_for_disjoint_split_raises() -> None:
    dm = SyntheticDataModule(task="copy", seq_len=2, num_symbols=2, num_train=200, num_val=5)
    with pytest.raises(ValueError, match="too few distinct inputs"):
        dm.setup()


# ----------------------------------------------------------------------------- DataModules

EXPECTED_KEYS = {
    "tagging": {"tokens": torch.int64, "padding_mask": torch.bool, "targets": torch.int64},
    "seq2seq": {
        "src": torch.int64,
        "src_padding_mask": torch.bool,
        "tgt_in": torch.int64,
        "tgt_out": torch.int64,
        "tgt_padding_mask": torch.bool,
    },
    "lm": {"tokens": torch.int64, "targets": torch.int64},
}


@pytest.mark.parametrize(("task", "fmt"), ALL_CASES)
def test_synthetic_datamodule_batches_follow_the_contract(task: str, fmt: str) -> None:
    dm = SyntheticDataModule(task=task, format=fmt, num_train=40, num_val=20, batch_size=8)
    dm.setup("fit")
    for loader in (dm.train_dataloader(), dm.val_dataloader()):
        batch = next(iter(loader))
        assert {k: v.dtype for k, v in batch.items()} == EXPECTED_KEYS[fmt]
        assert all(v.shape[0] == 8 for v in batch.values())
        for v in batch.values():
            assert v.shape[1] <= dm.max_len
        ids = torch.cat([v.flatten() for k, v in batch.items() if "mask" not in k])
        ids = ids[ids != IGNORE_INDEX]
        assert ids.min() >= 0 and ids.max() < dm.vocab_size
    assert (dm.pad_id, dm.bos_id, dm.eos_id) == (0, 1, 2)
    assert dm.tokenizer.vocab_size == dm.vocab_size


def test_main_job_defaults() -> None:
    dm = SyntheticDataModule()
    assert (dm.task, dm.seq_len, dm.num_symbols, dm.format) == ("reverse", 16, 10, "tagging")
    assert dm.vocab_size == 13 and dm.max_len == 16
    dm.setup()
    tokens = dm.train_data["tokens"][0]
    assert dm.decode(dm.train_data["targets"][0]) == dm.decode(tokens)[::-1]
    padded = SyntheticDataModule(seq_len=6, min_len=2, num_train=50, num_val=5)
    padded.setup()
    short = int(padded.train_data["padding_mask"].sum(1).argmin())
    text = padded.decode(padded.train_data["tokens"][short])
    assert padded.decode(padded.train_data["targets"][short]) == text[::-1] and len(text) < 6


def test_training_order_is_seeded() -> None:
    def first_batch(seed: int) -> torch.Tensor:
        dm = SyntheticDataModule(num_train=64, num_val=16, batch_size=8, seed=seed)
        dm.setup()
        return next(iter(dm.train_dataloader()))["tokens"]

    torch.manual_seed(1)
    a = first_batch(0)
    torch.manual_seed(2)
    assert torch.equal(a, first_batch(0))
    assert not torch.equal(a, first_batch(1))


# ----------------------------------------------------------------------------- grammar


def test_grammar_translation_reorders_and_agrees() -> None:
    sentences = sample_sentences(300, generator=_gen())
    for s in sentences:
        en, ve = s.english(), s.verbal()
        subj = len(s.subject.english())
        # Verb-final: the English verb sits after the subject, the Verbal verb comes last.
        assert en[subj] in ENGLISH_VERBS
        assert ve[-1].endswith(("a", "an", "o", "on"))
        assert ve[-1].endswith("n") == s.subject.plural  # agreement in the target language
        if s.tense == "present":
            assert en[subj].endswith("s") != s.subject.plural  # "eats" / "eat"
        assert len(en) == len(ve)
        for phrase in (s.subject, s.obj):
            assert phrase.english()[0] != "a" or not phrase.plural  # no "a men"


def test_grammar_example_by_hand() -> None:
    from transformer_lab.data.grammar import Sentence, _NounPhrase

    men = _NounPhrase(noun=0, adjective=0, plural=True, indefinite=False)
    fish = _NounPhrase(noun=5, adjective=None, plural=False, indefinite=True)
    s = Sentence(subject=men, verb=0, tense="past", obj=fish)
    assert " ".join(s.english()) == "the big men ate a fish"
    assert " ".join(s.verbal()) == "tori gran li pesk un mangon"
    swapped = Sentence(subject=fish, verb=0, tense="present", obj=men)
    assert " ".join(swapped.english()) == "a fish eats the big men"
    assert " ".join(swapped.verbal()) == "pesk un tori gran li manga"


def test_agreement_probes_are_minimal_pairs() -> None:
    probes = agreement_probes(100, generator=_gen())
    plurals = {noun[1] for noun in NOUNS}
    assert any(p[0][-1] in plurals for p in probes) and any(p[0][-1] not in plurals for p in probes)
    for prefix, good, bad in probes:
        assert prefix[0] in {"the", "a"} and good != bad
        assert good.endswith("s") == (prefix[-1] not in plurals)  # "the man eats", "the men eat"


def test_grammar_config_validates() -> None:
    with pytest.raises(ValueError, match=r"plural_prob=1\.5"):
        GrammarConfig(plural_prob=1.5)
    singular = sample_sentences(50, generator=_gen(), config=GrammarConfig(plural_prob=0.0))
    assert not any(s.subject.plural or s.obj.plural for s in singular)


def test_grammar_seeding_and_text() -> None:
    a = make_grammar_translation(20, generator=_gen(3))
    b = make_grammar_translation(20, generator=_gen(3))
    assert all(torch.equal(a[k], b[k]) for k in a)
    text = grammar_text(5, seed=1)
    assert text == grammar_text(5, seed=1) != grammar_text(5, seed=2)
    assert len(text.splitlines()) == 5 and all(line.endswith(".") for line in text.splitlines())
    words = set(text.replace(".", " ").split())
    assert words <= set(english_vocabulary())


def test_grammar_lm_targets_are_shifted_tokens() -> None:
    d = make_grammar_lm(30, generator=_gen())
    tokens, targets = d["tokens"], d["targets"]
    assert (tokens[:, 0] == BOS_ID).all()
    real = targets != IGNORE_INDEX
    torch.testing.assert_close(targets[:, :-1][real[:, :-1]], tokens[:, 1:][real[:, :-1]])
    assert ((targets == EOS_ID).sum(1) == 1).all()


@pytest.mark.parametrize("task", ["translation", "lm"])
def test_grammar_datamodule(task: str) -> None:
    dm = GrammarDataModule(task=task, num_train=200, num_val=50, batch_size=16)
    dm.setup("fit")
    fmt = "seq2seq" if task == "translation" else "lm"
    batch = next(iter(dm.train_dataloader()))
    assert {k: v.dtype for k, v in batch.items()} == EXPECTED_KEYS[fmt]
    assert all(v.shape[1] <= dm.max_len for v in batch.values())
    assert _rows(dm.train_data).isdisjoint(_rows(dm.val_data))
    if task == "translation":
        assert dm.src_vocab_size == dm.tgt_vocab_size == dm.vocab_size
        assert dm.vocab_size == 4 + len(english_vocabulary()) + len(target_vocabulary())
        assert batch["tgt_out"].max() < dm.vocab_size and batch["src"].max() < dm.vocab_size
        sentence = dm.tokenizer.decode(batch["src"][0], skip_special=True)
        translation = dm.tokenizer.decode(batch["tgt_out"][0], skip_special=True)
        assert sentence.split()[0] in {"the", "a"}
        assert set(translation.split()) <= set(target_vocabulary())
    else:
        assert dm.vocab_size == dm.src_vocab_size == dm.tokenizer.vocab_size
    with pytest.raises(ValueError, match="task='poetry'"):
        GrammarDataModule(task="poetry")


def test_batches_are_pinned_only_for_a_trainer_on_cuda() -> None:
    """Issue 39: a lab trained on the CPU of a GPU machine (``lab.CPU_LABS``) pins nothing (it
    would start CUDA and pin every batch for nothing); a loader without a trainer pins wherever
    CUDA is."""
    from types import SimpleNamespace

    from transformer_lab.data.datamodules import SyntheticDataModule, pin_memory

    def on(kind: str) -> SimpleNamespace:
        return SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device(kind)))

    assert pin_memory(on("cuda")) is True and pin_memory(on("cpu")) is False
    assert pin_memory() is torch.cuda.is_available()
    dm = SyntheticDataModule(task="copy", seq_len=6, num_symbols=5, num_train=16, num_val=8)
    assert dm.train_dataloader().pin_memory is torch.cuda.is_available()
    dm.trainer = on("cpu")
    assert dm.train_dataloader().pin_memory is False and dm.val_dataloader().pin_memory is False
