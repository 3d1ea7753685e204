"""Visible checks of lab 06 (training an encoder-decoder), called by the visible test cells:
``DecoderBlock``, ``shift_right``, ``sequence_loss`` and ``greedy_decode`` as ordinary parts on
stored worked examples; ``TranslationModule`` on :class:`StandInTranslator`; ``train_translator``
on Lightning's ``BoringModel`` (:func:`train_translator_facts`).

Reference: Prince, *Understanding Deep Learning*, sections 12.7.1 and 12.8; Vaswani et al.,
"Attention Is All You Need", 2017, sections 3.1-3.2 and 5.3 (the warm-up schedule).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lab.checks import spec
from transformer_lab.checks._common import (
    call_forbidding,
    expect_module,
    expect_shape,
    expect_true,
    generator,
    kernel_side,
    load_weights,
    run_beside,
)
from transformer_lab.checks._generated import Ordinary, floats_at, plain, tensors, token_ids
from transformer_lab.checks._lightning import (
    Schedule,
    build_module,
    judge_configure_optimizers,
    judge_training_step,
    learning_rates,
    parse_optimizers,
)
from transformer_lab.judge.mirror import portable
from transformer_lab.training.trainers import BARE, lightning_logs_off

#: The lab's spec (``specs/lab06.toml``): its bans and shared tolerances.
SPEC = spec.load("06_decoder_training")
BLOCK_BAN = SPEC.ban("block")
MODULE_BAN = SPEC.ban("module")


def _hint(mistake: str) -> str:
    """The hint of the spec's record ``mistake`` (where a check raises for it itself)."""
    return SPEC.mistake(mistake).hint


class BlockCase(NamedTuple):
    """One case of the decoder block's checks: what the student's class is judged on, the
    block's setting last (eval mode, float32, unless given)."""

    d_model: int
    n_heads: int
    d_ff: int
    weights: Mapping[str, Tensor]  # named as the kit's block's (self_attn.q_proj.weight, ...)
    x: Tensor  # (B, T, D)
    memory: Tensor  # (B, S, D)
    self_mask: Tensor | None  # (B or 1, 1, T, T), True where a position may be attended to
    memory_mask: Tensor | None  # (B, 1, 1, S)
    dropout: float = 0.0
    training: bool = False
    dtype: torch.dtype = torch.float32


def block_what(*case: Any) -> str:
    """One case's call as a student would write it (with the block's setting), for messages."""
    c = BlockCase(*case)
    sizes = ", ".join(map(str, case[:3])) + (f", dropout={c.dropout:g}" if c.dropout else "")
    args = f"x {tuple(c.x.shape)}, memory {tuple(c.memory.shape)}"
    args += "" if c.self_mask is None else ", self_mask=causal"
    args += "" if c.memory_mask is None else ", memory_mask=source padding"
    mode = " in training mode" if c.training else " in eval mode" if c.dropout else ""
    mode += "" if c.dtype == torch.float32 else f" in {c.dtype}"
    return f"DecoderBlock({sizes})({args}){mode}"


def block_call(cls: Callable[..., nn.Module], *case: Any) -> Tensor:
    """One :class:`BlockCase`: the student's ``cls(d_model, n_heads, d_ff[, dropout])``, built
    under the ban with the case's weights loaded
    (:func:`~transformer_lab.checks._common.load_weights`), run in the case's mode and dtype
    (which the output must keep): its output ``(B, T, D)``."""
    c, what = BlockCase(*case), block_what(*case)
    args = (*case[:3], c.dropout) if c.dropout else case[:3]
    built = what.partition("(x ")[0]  # DecoderBlock(d_model, n_heads, d_ff[, dropout])
    block = expect_module(call_forbidding(cls, args, {}, ban=BLOCK_BAN, what=built), built)
    load_weights(block, c.weights, f"your {built}", SPEC.parts["DecoderBlock"].layout)
    block.train(c.training).to(c.dtype)
    masks = {"self_mask": c.self_mask, "memory_mask": c.memory_mask}
    inputs = (c.x.to(c.dtype), c.memory.to(c.dtype))
    cross = " ".join(_hint(f"decoder_block Block{m}") for m in ("KeysFromX", "MasksSwapped"))
    out = call_forbidding(block, inputs, masks, ban=BLOCK_BAN, what=what, on_error=cross)
    out = expect_shape(out, tuple(c.x.shape), what)
    expect_true(
        out.dtype == c.dtype or c.dtype == torch.float32,  # float32 inputs: any float (as before)
        f"{what} turned {c.dtype} inputs into {out.dtype}: build any tensor inside forward with "
        "the input's dtype and device.",
    )
    return out.detach()


#: ``DecoderBlock(d_model, n_heads, d_ff)(x, memory, self_mask=..., memory_mask=...)``: a case
#: is a :class:`BlockCase` (stored: its first eight fields).
BLOCK = Ordinary(
    "lab06",
    call=block_call,
    what=block_what,
    rule="The block is x = norm1(x + self_attn(x, x, x, self_mask)); x = norm2(x + "
    "cross_attn(x, memory, memory, memory_mask)); x = norm3(x + ff(x)). Check which norm "
    "follows which sub-layer.",
    **floats_at(SPEC.tol("float32")),
)
check_decoder_block = BLOCK.visible(
    "check_decoder_block",
    """Worked examples: ``DecoderBlock(16, 4, 32)`` with stored weights, in eval mode, on ``x
    (2, 5, 16)`` and ``memory (2, 7, 16)``: without masks, then with a causal self-mask and
    padding masks of the targets and of memory.""",
)


def _shift_call(fn: Callable[..., Tensor], targets: Tensor, bos_id: int) -> list[Any]:
    """``fn(targets, bos_id)`` under the ban, its input left as it was: token ids ``(B, T)``."""
    what = SHIFT.what(targets, bos_id)
    in_place = f"changed its input `targets` in place. {_hint('shift_right shift_in_place')}"
    got = call_forbidding(
        fn, (targets, bos_id), {}, ban=SPEC.ban("shift"), what=what, in_place=in_place
    )
    return token_ids(got, tuple(targets.shape), what, _hint("shift_right shift_float")).tolist()


#: ``shift_right(targets, bos_id)``: a case is ``(targets, bos_id)``.
SHIFT = Ordinary(
    "lab06",
    call=_shift_call,
    what=lambda targets, bos_id: f"shift_right({targets.tolist()}, bos_id={bos_id})",
    rule="Position 0 holds BOS and position t the target of position t - 1.",
    load=tensors,
    output=plain,  # token ids as nested lists
)
check_shift_right = SHIFT.visible(
    "check_shift_right",
    """Worked examples: ``[[5, 6, 7, 2], [8, 2, 0, 0]]`` with ``bos_id`` 1, ``[[9, 3, 2]]``
    with ``bos_id`` 4.""",
)


def loss_call(fn: Callable[..., Tensor], logits: Tensor, targets: Tensor, pad_id: int) -> Tensor:
    """``fn(logits, targets, pad_id)`` under the ban, the logits needing gradients: a scalar
    tensor that keeps its graph (training calls ``loss.backward()``)."""
    what = LOSS.what(logits, targets, pad_id)
    logits = logits.detach().clone().requires_grad_()
    got = call_forbidding(fn, (logits, targets, pad_id), {}, ban=SPEC.ban("loss"), what=what)
    expect_true(
        expect_shape(got, (), what).requires_grad,
        f"{what} returns a tensor without a graph (no grad_fn): training calls "
        "loss.backward(). Avoid .item(), .detach(), torch.tensor(...) of a result and argmax.",
    )
    return got.detach()


#: ``sequence_loss(logits, targets, pad_id)``: a case is ``(logits, targets, pad_id)``; an answer
#: not finite where the right loss is, is a log taken of a softmax (+-1e4 or confident logits).
LOSS = Ordinary(
    "lab06",
    call=loss_call,
    what=lambda logits, _targets, pad_id: (
        f"sequence_loss(logits {tuple(logits.shape)}, targets, pad_id={pad_id})"
    ),
    rule="The loss is -log softmax(logits)[target] at every position whose target is not "
    "pad_id, summed and divided by the number of such positions.",
    named=lambda case: (
        None if case.got.isfinite().all() else _hint("sequence_loss loss_log_of_softmax")
    ),
    **floats_at(**SPEC.close_tol("loss"))
    | {"describe": lambda case: f"{case.what} returned {case.got:.6g}, expected {case.want:.6g}."},
)

check_sequence_loss = LOSS.visible(
    "check_sequence_loss",
    """Worked examples: a padded batch with ``pad_id`` 0, then one with ``pad_id`` 5; the loss
    keeps its graph.""",
)


def copy_task_batch(
    batch_size: int, config: Any, *, max_src: int = 6, seed: int = 0
) -> dict[str, Tensor]:
    """A seq2seq batch (``docs/contracts.md``) of the kit's copy task, whose sources have
    2..``max_src`` symbols, its ids moved up by a stand-in's ``config.pad_id`` (the kit's PAD 0,
    BOS 1 and EOS 2 become the stand-in's, whose BOS and EOS follow its padding id)."""
    from transformer_lab.data.synthetic import make_sequence_task

    V = config.tgt_vocab_size
    batch = make_sequence_task(
        "copy",
        batch_size,
        seq_len=max_src,
        num_symbols=V - 3,
        min_len=min(2, max_src),
        format="seq2seq",
        generator=generator(seed),
    )
    return {k: v if v.dtype == torch.bool else (v + config.pad_id) % V for k, v in batch.items()}


class StandInTranslator(nn.Module):
    """The stand-in encoder-decoder of lab 06's checks, for its training code and decoding loops.

    ``encode`` returns the source ids and their mask as the "memory" (counting its calls);
    ``decode`` logits that put an answer known in advance (:meth:`_answer`) 3 above a small
    network of the decoder's input: by default the copy task's (metrics neither 0 nor 1);
    ``scripted=True``, one that feeds back the previous token, above a fixed ramp (a loop that
    feeds back the wrong token, stops wrongly or samples shows). The source is padding only
    where both ``encode``'s and ``decode``'s masks say so.
    """

    def __init__(
        self,
        vocab_size: int = 10,
        *,
        pad_id: int = 0,
        bos_id: int = 1,
        eos_id: int = 2,
        seed: int = 0,
        scripted: bool = False,
    ) -> None:
        super().__init__()
        ids = {"pad_id": pad_id, "bos_id": bos_id, "eos_id": eos_id, "max_len": 64}
        sizes = {"src_vocab_size": vocab_size, "tgt_vocab_size": vocab_size}
        self.portable_restore({"config": ids | sizes, "scripted": scripted})
        g, d_model = generator(seed), 8
        self.tgt_embed = nn.Parameter(torch.randn(vocab_size, d_model, generator=g))
        self.out = nn.Linear(d_model, vocab_size)
        with torch.no_grad():
            self.out.weight.copy_(0.6 * torch.randn(vocab_size, d_model, generator=g))
            self.out.bias.copy_(0.3 * torch.randn(vocab_size, generator=g))

    def portable_state(self) -> dict[str, Any]:
        """What the kernel's copy needs besides the parameters (see ``judge.mirror.portable``)."""
        return {"config": dict(vars(self.config)), "scripted": self.scripted}

    def portable_restore(self, state: dict[str, Any]) -> None:
        self.config = SimpleNamespace(**state["config"])
        self.scripted = bool(state["scripted"])
        c = self.config
        self.symbols = [
            i for i in range(c.tgt_vocab_size) if i not in (c.pad_id, c.bos_id, c.eos_id)
        ]
        self.encode_calls = 0

    def encode(self, src: Tensor, src_padding_mask: Tensor | None = None) -> Tensor:
        self.encode_calls += 1
        real = (
            torch.ones_like(src, dtype=torch.bool) if src_padding_mask is None else src_padding_mask
        )
        return torch.stack([src, real], dim=-1).to(self.tgt_embed.dtype)  # (B, S, 2)

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src_padding_mask: Tensor | None = None,
        tgt_padding_mask: Tensor | None = None,
    ) -> Tensor:
        src, real = memory[..., 0].round().long(), memory[..., 1] > 0.5  # (B, S)
        expect_true(not tgt_in.is_floating_point(), _hint("greedy_decode greedy_feeds_logits"))
        mask = torch.ones_like(real) if src_padding_mask is None else src_padding_mask
        real = real | mask.to(real.device)  # (B, S): padding where both masks say so
        logits = self.out(torch.tanh(self.tgt_embed[tgt_in]))  # (B, T, V)
        if self.scripted:  # ties never happen
            logits = torch.linspace(0.0, 0.5, logits.shape[-1], device=src.device).expand_as(logits)
        one_hot = F.one_hot(self._answer(tgt_in, src, real), self.config.tgt_vocab_size)
        return logits + 3.0 * one_hot.to(logits.dtype)

    def forward(
        self,
        src: Tensor,
        tgt_in: Tensor,
        src_padding_mask: Tensor | None = None,
        tgt_padding_mask: Tensor | None = None,
    ) -> Tensor:
        return self.decode(tgt_in, self.encode(src, src_padding_mask), src_padding_mask)

    def _answer(self, tgt_in: Tensor, src: Tensor, real: Tensor) -> Tensor:
        """``(B, T)``: ``symbol((x_t + y_{t-1}) mod K)`` over the ``real`` source symbols (a
        prefix; ``y`` 0 unless scripted: a copy), then EOS, then ``symbol(t mod K)``."""
        symbols = torch.tensor(self.symbols, device=src.device)
        K, (B, T), S = len(symbols), tgt_in.shape, src.shape[1]
        index = torch.zeros(self.config.tgt_vocab_size, dtype=torch.long, device=src.device)
        index[symbols] = torch.arange(K, device=src.device)  # other ids count as symbol 0
        n = real.sum(1, keepdim=True)  # (B, 1): real source tokens
        source = F.pad(index[src], (0, max(0, T - S)))[:, :T]  # (B, T)
        t = torch.arange(T, device=src.device)[None]  # (1, T)
        prev = index[tgt_in] * (t > 0) * self.scripted  # (B, T): the token fed at t, 0 at t = 0
        token = torch.where(t < n, symbols[(source + prev) % K], symbols[t % K].expand(B, T))
        return token.masked_fill(t == n, self.config.eos_id)


@portable  # rebuilt in the kernel: the student's loss on its logits keeps its graph there
class PortableTranslator(StandInTranslator):
    """:class:`StandInTranslator` rebuilt as itself in the student's kernel when judged, for the
    training code (the decoding checks keep theirs on the grader's side, where its
    ``encode_calls`` are counted); its BOS and EOS follow ``pad_id``."""

    def __init__(self, vocab_size: int = 10, pad_id: int = 0, seed: int = 0) -> None:
        pad_id, bos_id, eos_id = ((pad_id + k) % vocab_size for k in range(3))
        super().__init__(vocab_size, pad_id=pad_id, bos_id=bos_id, eos_id=eos_id, seed=seed)


#: The visible checks' hyper-parameters of ``TranslationModule``.
_HPARAMS = {"lr": 3e-3, "warmup_steps": 20, "total_steps": 100}


def _module_under_test(cls: Callable[..., Any], model: Any, **hparams: float) -> Any:
    """``cls(model, model.config.pad_id, ...)`` (``hparams`` over :data:`_HPARAMS`)."""
    args = (model, model.config.pad_id)
    return build_module(cls, "TranslationModule", *args, ban=MODULE_BAN, **_HPARAMS | hparams)


def teacher_forced_loss(
    model: Any,
    batch: Mapping[str, Tensor],
    *,
    feed: str = "tgt_in",
    labels: str = "tgt_out",
    ignore: int | None = None,
    masks: bool = True,
) -> Tensor:
    """PyTorch's cross-entropy of ``model``'s logits on ``batch`` against ``batch["tgt_out"]``,
    ``model.config.pad_id`` ignored: the loss of a right ``training_step``. With an option
    changed (the spec's records), a typical wrong one: the decoder ``feed`` another key, other
    ``labels``, another id to ``ignore`` (-100: none), the model called without its ``masks``."""
    kept = ("src_padding_mask", "tgt_padding_mask") if masks else ()
    logits = model(batch["src"], batch[feed], **{k: batch[k] for k in kept})  # (B, T, V)
    ignored = model.config.pad_id if ignore is None else ignore
    return F.cross_entropy(logits.flatten(0, 1), batch[labels].flatten(), ignore_index=ignored)


def check_training_step(
    cls: Callable[..., Any], *, pad_id: int = 0, vocab_size: int = 10, seed: int = 61
) -> None:
    """One ``training_step`` on a stand-in model: the teacher-forced loss (typical wrong losses
    named), its graph, and what is logged (:func:`judge_training_step`, shared with lab 04)."""
    model = PortableTranslator(vocab_size, pad_id, seed)
    module = _module_under_test(cls, model)
    batch = copy_task_batch(6, model.config, seed=seed)
    records = SPEC.parts["TranslationModule"].options_for(teacher_forced_loss)
    with torch.no_grad():  # the records' options give typical wrong losses
        wrong = [(teacher_forced_loss(model, batch, **kw), hint) for hint, kw in records]
        expected = teacher_forced_loss(model, batch)
    judge_training_step(
        module,
        batch,
        ban=MODULE_BAN,
        expected=expected,
        mistakes=wrong,
        hint="The loss is your sequence_loss of self(batch) against batch['tgt_out'], padding "
        "(self.pad_id) ignored.",
    )


_VALIDATE_WHAT = "validation_step (run by Trainer.validate on a stand-in model)"
#: What the epoch's values are: the hints of the records that get each wrong, in that order.
_VALIDATION = " ".join(
    _hint(f"translation_module Module{m}")
    for m in ("ValLossPadding", "ExactMatchWithPadding", "NeverReset")
)


@kernel_side
def validation_runs(cls: type, model: Any, runs: list[list[dict[str, Tensor]]]) -> list[dict]:
    """``Trainer.validate`` of one ``cls(model, model.config.pad_id)`` on each run's batches;
    the epoch values each run logged, as numbers (the harness the judge runs in the kernel)."""
    import lightning as L
    from torch.utils.data import DataLoader

    module = _module_under_test(cls, model)
    logged = []
    for batches in runs:
        with lightning_logs_off():
            trainer = L.Trainer(accelerator="cpu", devices=1, **BARE)
            results = call_forbidding(
                trainer.validate,
                (module,),
                {"dataloaders": DataLoader(batches, batch_size=None), "verbose": False},
                ban=MODULE_BAN,
                what=_VALIDATE_WHAT,
            )
        logged.append({str(k): float(v) for k, v in dict(results[0]).items()} if results else {})
    return logged


def check_validation_step(
    cls: type, *, pad_id: int = 0, vocab_size: int = 10, seed: int = 62
) -> None:
    """``validation_step`` through ``Trainer.validate`` (in the kernel, where ``cls`` lives,
    when judged): val_loss, val_acc and val_exact_match of the epoch, in two runs.

    Lightning averages a logged number over the epoch weighted by the batch size, and computes
    a logged metric object over the whole epoch; each run's batches differ in size and sentence
    length, so that per-batch averages differ from those values; the second run validates other
    sentences, fewer: a metric that is never reset mixes both runs.
    """
    model = PortableTranslator(vocab_size, pad_id, seed)
    sizes = ((8, 6), (6, 2), (3, 5), (5, 4))  # (batch size, longest source)
    runs = [
        [copy_task_batch(n, model.config, max_src=s, seed=first + n) for n, s in some]
        for first, some in ((seed, sizes[:3]), (seed + 10, sizes[1:]))
    ]
    results = run_beside(cls, validation_runs, cls, model, runs)
    for i, (batches, got) in enumerate(zip(runs, results, strict=True)):
        run = " (second run, other sentences)" if i else ""
        losses, right, exact = [], [], []
        with torch.no_grad():
            for batch in batches:
                masks = {k: batch[k] for k in ("src_padding_mask", "tgt_padding_mask")}
                logits = model(batch["src"], batch["tgt_in"], **masks)  # (B, T, V)
                ok, keep = logits.argmax(-1) == batch["tgt_out"], batch["tgt_out"] != pad_id
                losses += [float(teacher_forced_loss(model, batch))] * len(logits)
                right.append(ok[keep])
                exact.append((ok | ~keep).all(-1))
        expected = {
            "val_loss": sum(losses) / len(losses),
            "val_acc": float(torch.cat(right).double().mean()),
            "val_exact_match": float(torch.cat(exact).double().mean()),
        }
        for name, value in expected.items():
            expect_true(
                name in got,
                f"{_VALIDATE_WHAT} logged {sorted(got) or 'nothing'}, not '{name}'. "
                + _hint("translation_module ModuleNoExactMatch"),
            )
            g = float(got[name])
            expect_true(
                abs(g - value) <= 1e-4 + 1e-4 * abs(value),
                f"{_VALIDATE_WHAT}{run}: {name} is {g:.4f}, expected {value:.4f}. {_VALIDATION}",
            )


def check_configure_optimizers(cls: Callable[..., Any], seed: int = 63, **hparams: float) -> None:
    """``configure_optimizers`` called directly (``hparams`` over lr 3e-3, 20 and 100 steps):
    every parameter, stepped per step, and the schedule's shape, a warm-up to ``lr`` then a
    decay (:func:`judge_configure_optimizers`, shared with lab 04)."""
    hparams = _HPARAMS | hparams
    module = _module_under_test(cls, PortableTranslator(seed=seed), **hparams)
    fix = _hint("translation_module ModuleUsesTrainer")
    judge_configure_optimizers(module, module, Schedule(**hparams), ban=MODULE_BAN, on_error=fix)


_TRAIN_RULE = (
    "trainer = L.Trainer(max_steps=max_steps, precision=session.precision, "
    "logger=CSVLogger(session.runs, name=name), val_check_interval=max(1, max_steps // 4), "
    "check_val_every_n_epoch=None); trainer.fit(module, datamodule=datamodule); return trainer."
)


@kernel_side
def train_translator_facts(
    fn: Callable[..., Any], session: Any, *, precision: str, max_steps: int, name: str
) -> dict[str, Any]:
    """Run ``fn`` on Lightning's ``BoringModel`` and ``BoringDataModule`` (no pin_memory, which
    warns without an accelerator) with a session of ``precision``; what the check judges, as
    data (the harness the judge runs in the kernel)."""
    from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel, RandomDataset
    from torch.utils.data import DataLoader

    runs = Path(session.runs) / "checks"
    fake = dataclasses.replace(session, precision=precision, runs=runs, profile="grading")
    module, data = BoringModel(), BoringDataModule()
    module.val_dataloader = None  # its own validation data: only the DataModule's may be used
    data.setup("fit")  # a train_translator that reads data.train_dataloader() itself gets one
    data.val_dataloader = lambda: DataLoader(RandomDataset(32, 2))  # not 64: validation is quick
    what = f"train_translator(module, datamodule, max_steps={max_steps}, session, name={name!r})"
    given = {"max_steps": max_steps, "session": fake, "name": name}
    with lightning_logs_off():
        trainer = call_forbidding(fn, (module, data), given, ban=MODULE_BAN, what=what)
    log_dir = getattr(getattr(trainer, "logger", None), "log_dir", None)
    return {
        "what": what,
        "runs": str((runs / name).resolve()),
        "returned": type(trainer).__name__,
        "training steps of the module given": module.global_step,  # 0 unless it was fit
        "precision": str(getattr(trainer, "precision", None)),
        "logs in": None if log_dir is None else str(Path(log_dir).resolve().parent),
        "validated during the run": sum(getattr(trainer, "num_val_batches", None) or []) > 0,
    }


def check_train_translator(
    fn: Callable[..., Any],
    session: Any,
    *,
    runs: Sequence[tuple[str, int]] = (("bf16-mixed", 8), ("32-true", 8)),
    name: str = "check",
) -> None:
    """``fn`` trains a BoringModel (:func:`train_translator_facts`, where ``fn`` lives) in each
    of the ``runs``' precision for its ``max_steps``, logging under ``session.runs`` and
    validating during the run: the Trainer it returns, its steps, precision, logger and
    validation. A precision hard-coded instead of ``session.precision`` fails one of the two."""
    for precision, max_steps in runs:
        run = {"precision": precision, "max_steps": max_steps, "name": name}
        facts = run_beside(fn, train_translator_facts, fn, session, **run)
        want = {
            "returned": "Trainer",
            "training steps of the module given": max_steps,
            "precision": precision,
            "logs in": facts["runs"],  # session.runs/checks/name, as the kernel resolves it
            "validated during the run": True,
        }
        for fact, value in want.items():
            expect_true(
                facts[fact] == value,
                f"{facts['what']}: {fact} {facts[fact]!r}, expected {value!r}: {_TRAIN_RULE}",
            )


def trusted_data(datamodule: Any) -> Any:
    """The notebook's ``GrammarDataModule`` rebuilt from the settings it was built with (its
    ``hparams``), so that the held-out sentences and the tokenizers a check uses are the
    grader's own when ``datamodule`` lives in the student's kernel, and the same locally."""
    from transformer_lab.data import GrammarDataModule

    try:
        settings = datamodule.hparams.copy()  # a dict: from the kernel, as data
    except (AttributeError, TypeError):  # no settings, or settings that are not a dict
        settings = {}
    known = inspect.signature(GrammarDataModule).parameters
    expect_true(
        bool(settings)
        and isinstance(settings, dict)
        and all(k in known and type(v) in (int, float, str) for k, v in settings.items()),
        "`data` is not the notebook's GrammarDataModule (its settings are not the numbers it is "
        "built with): keep the data cell as it is.",
    )
    rebuilt = GrammarDataModule(**settings)
    rebuilt.setup()
    return rebuilt


def check_trained_translator(
    model: nn.Module, datamodule: Any, block_cls: type, *, min_exact_match: float = 0.9
) -> float:
    """A translator of the student's blocks gets ``min_exact_match`` of held-out sentences right
    (teacher forcing on the DataModule's validation sentences, never trained on: a sentence
    counts when every target token is the argmax of the logits); returns that accuracy."""
    datamodule = trusted_data(datamodule)
    blocks = list(getattr(model, "decoder_blocks", []))
    expect_true(
        bool(blocks) and all(isinstance(b, block_cls) for b in blocks),
        "the translator must be built from your DecoderBlock (build_translator(DecoderBlock)).",
    )
    device = next(model.parameters()).device
    data = {k: v.to(device) for k, v in datamodule.val_data.items()}
    with torch.no_grad():
        masks = {k: data[k] for k in ("src_padding_mask", "tgt_padding_mask")}
        logits = model.eval()(data["src"], data["tgt_in"], **masks)
    right = (logits.argmax(-1) == data["tgt_out"]) | (data["tgt_out"] == datamodule.pad_id)
    score = float(right.all(dim=-1).float().mean())  # every real target token right
    expect_true(
        score >= min_exact_match,
        f"your translator gets {score:.1%} of {len(data['src'])} held-out sentences exactly right "
        f"(teacher forcing), at least {min_exact_match:.0%} expected. Look at the loss curve: "
        "does the loss fall (learning rate, warm-up, all parameters in the optimizer)?",
    )
    return score


def _decode_call(
    fn: Callable[..., Tensor],
    model: nn.Module,
    src: Tensor,
    bos_id: int,
    eos_id: int,
    max_len: int,
    mask: Tensor | None,
) -> list[Any]:
    """The student's ``greedy_decode`` under the ban: token ids ``(B, L)``, the source encoded
    once (a stand-in counts its ``encode`` calls)."""
    what = DECODE.what(model, src, bos_id, eos_id, max_len, mask)
    kwargs = {} if mask is None else {"src_padding_mask": mask}
    before = getattr(model, "encode_calls", 0)
    got = call_forbidding(
        fn, (model, src, bos_id, eos_id, max_len), kwargs, ban=SPEC.ban("decode"), what=what
    )
    calls = getattr(model, "encode_calls", 1) - before
    expect_true(
        calls <= 1,
        f"{what} encoded the source {calls} times. "
        + _hint("greedy_decode greedy_encodes_every_step"),
    )
    fix = "Build the sequences from the argmax's ids."
    return token_ids(got, (src.shape[0], None), what, fix).tolist()


#: ``greedy_decode(model, src, bos_id, eos_id, max_len, src_padding_mask=mask)``: a case is
#: ``(model, src, bos_id, eos_id, max_len, mask)`` (stored: a scripted
#: :class:`StandInTranslator`'s arguments for ``model``).
DECODE = Ordinary(
    "lab06",
    call=_decode_call,
    what=lambda _model, src, bos_id, eos_id, max_len, mask: (
        f"greedy_decode(model, src {tuple(src.shape)}, bos_id={bos_id}, eos_id={eos_id}, "
        f"max_len={max_len}" + (", src_padding_mask)" if mask is not None else ")")
    ),
    rule="Start from BOS, append the argmax of the LAST position's logits, fill sentences that "
    "have produced EOS with model.config.pad_id, and stop as soon as every sentence has produced "
    "EOS or the length, BOS included, reaches max_len.",
    load=lambda model, *case: (StandInTranslator(**model, scripted=True), *tensors(*case)),
    output=plain,  # token ids as nested lists
)
check_greedy_decode = DECODE.visible(
    "check_greedy_decode",
    """Worked examples on a scripted :class:`StandInTranslator`: three sources of different
    lengths (one padded with junk behind its mask), then a ``max_len`` that cuts every sentence
    short.""",
)


__all__ = [*(n for n in dir() if n.startswith("check_")), "learning_rates", "parse_optimizers"]
