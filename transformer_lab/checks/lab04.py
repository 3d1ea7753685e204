"""Visible checks of lab 04 (the transformer block): layer_norm, FeedForward, EncoderBlock,
TaggingModule (``training_step``, ``configure_optimizers``) and the trained encoder.

Each part is declared once (an :class:`~transformer_lab.checks._generated.Ordinary`); its
visible check runs the student's answer, under the spec's bans, on worked examples stored from
the hidden oracles (``fixtures/lab04.json``: inputs and weights, the expected output, what each
typical mistake returns). A module is built from the case's sizes, given the case's weights and
run in eval mode, or in training mode with dropout drawn from the case's seed. The checks read
the attributes the notebook names: ``FeedForward.linear1``/``linear2``; ``EncoderBlock.self_attn``
(the kit's ``MultiHeadAttention`` or ``nn.MultiheadAttention(batch_first=True)``), ``.ff``,
``.norm1`` (attention sub-layer), ``.norm2`` (feed-forward sub-layer).

Reference: Prince, *Understanding Deep Learning*, section 12.4; Vaswani et al., "Attention Is
All You Need" (2017), sections 3.1, 5.3 and 5.4; Lightning's ``LightningModule`` documentation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from transformer_lab.checks import spec
from transformer_lab.checks._common import (
    Ban,
    Case,
    call_forbidding,
    call_student,
    close,
    expect_close,
    expect_module,
    expect_shape,
    expect_true,
    load_weights,
    note_mistake,
    stored,
)
from transformer_lab.checks._generated import Given, Ordinary
from transformer_lab.checks._lightning import (
    Schedule,
    judge_configure_optimizers,
    judge_training_step,
    learning_rates,
    parse_optimizers,
)
from transformer_lab.judge.mirror import portable

__all__ = [
    "check_configure_optimizers",
    "check_encoder_block",
    "check_encoder_block_dropout",
    "check_feed_forward",
    "check_layer_norm",
    "check_trained_encoder",
    "check_training_step",
    "learning_rates",  # the notebook plots the schedule with these two
    "parse_optimizers",
]

IGNORE_INDEX = -100

#: The lab's spec (``specs/lab04.toml``): its bans and shared tolerances.
SPEC = spec.load("04_transformer_block")
LAYER_NORM_BAN = SPEC.ban("layer_norm")
FEED_FORWARD_BAN = SPEC.ban("feed_forward")
BLOCK_BAN = SPEC.ban("block")
MODULE_BAN = SPEC.ban("module")

_LAB = "lab04"


@contextlib.contextmanager
def seeded(seed: int | None) -> Iterator[None]:
    """Run with the global CPU generator at ``seed`` (when given), then restore its state."""
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        yield


def values_at(atol: float, rtol: float = 1e-4) -> dict[str, Callable[..., Any]]:
    """``same`` and ``describe`` of an :class:`Ordinary` whose outputs are float tensors,
    compared at ``atol`` and ``rtol``, a wrong one described in ``expect_close``'s words."""

    def describe(case: Case[Any]) -> str:
        try:
            expect_close(case.got, case.want, case.what, atol=atol, rtol=rtol)
        except AssertionError as exc:
            return str(exc)
        return f"{case.what} is within the tolerance."  # never shown: the case failed

    return {"same": lambda got, want: close(got, want, atol=atol, rtol=rtol), "describe": describe}


def _from_json(*case: Any) -> tuple[Any, ...]:
    """A case stored as JSON data, back: nested lists as float32 tensors (or bool ones: masks),
    a dict of them as weights, anything else as it is."""

    def back(value: Any) -> Any:
        if isinstance(value, dict):
            return {name: back(item) for name, item in value.items()}
        if not isinstance(value, list):
            return value
        t = torch.tensor(value)
        return t if t.dtype == torch.bool else t.float()

    return tuple(back(value) for value in case)


#: What every part here compares: float tensors (float64 when stored), at the spec's tolerance.
_FLOATS: dict[str, Any] = {
    "load": _from_json,
    "output": lambda out: torch.as_tensor(out, dtype=torch.float64),
    **values_at(SPEC.tol("float32")),
}


def _ln_what(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> str:
    shown = "" if eps == 1e-5 else f", eps={eps:g}"
    dtype = "" if x.dtype == torch.float32 else f" ({x.dtype})"
    return f"layer_norm(x, weight, bias{shown}) on x of shape {tuple(x.shape)}{dtype}"


def layer_norm_call(
    fn: Callable[..., Any], x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5
) -> Tensor:
    """The student's ``layer_norm(x, weight, bias[, eps=...])`` under the lab's ban; a tensor of
    ``x``'s shape."""
    what = _ln_what(x, weight, bias, eps)
    got = call_forbidding(
        fn,
        (x.clone(), weight.clone(), bias.clone()),
        {} if eps == 1e-5 else {"eps": eps},
        ban=LAYER_NORM_BAN,
        what=what,
        on_error="Keep the statistics' last dimension (keepdim=True) so that they broadcast "
        "against x.",
    )
    return expect_shape(got, tuple(x.shape), what)


#: ``layer_norm(x, weight, bias, eps)``: a case is ``(x, weight, bias, eps)`` (stored: float32).
LAYER_NORM = Ordinary(
    _LAB,
    call=layer_norm_call,
    what=_ln_what,
    rule="For each token: the mean and the biased variance over the last dimension "
    "(keepdim=True), then weight * (x - mean) / sqrt(var + eps) + bias.",
    **_FLOATS,
)
check_layer_norm = LAYER_NORM.visible(
    "check_layer_norm",
    """Worked examples: the rows ``[1, 2, 3, 4]`` and ``[-2, 0, 0, 6]`` with weight 1 and bias 0,
    a 3-D input with a weight and a bias, a 4-D input with ``eps=1e-3``.""",
)


def run_module(
    module: nn.Module, x: Tensor, kwargs: dict[str, Any], what: str, *, ban: Ban, seed: int | None
) -> Any:
    """The student's ``module(x, **kwargs)`` under ``ban``, without its attention's own dropout:
    in training mode with dropout drawn from ``seed``, or (``None``) twice in eval mode."""
    module.train(seed is not None)
    shown = "".join(f", {name}" for name, value in kwargs.items() if value is not None)
    call = f"{what}(x{shown}){'' if seed is None else ' in training mode'}"

    def once(s: int | None) -> Any:
        with _no_attention_dropout(module), seeded(s), torch.no_grad():
            return call_forbidding(module, (x.clone(),), kwargs, ban=ban, what=call)

    if seed is not None:
        return once(seed)
    first, second = once(1), once(2)  # dropout off: one output whatever the seed
    if isinstance(first, Tensor) and isinstance(second, Tensor) and first.shape == second.shape:
        expect_true(
            close(first, second),
            f"{what} in eval mode gives another output at each call: dropout must switch off in "
            "eval mode. Use nn.Dropout modules (model.eval() switches them off), or "
            "F.dropout(..., training=self.training).",
        )
    return first


def _built(
    module: nn.Module, weights: Mapping[str, Tensor], x: Tensor, what: str, **layout: str
) -> None:
    """``module`` given ``weights`` (:func:`~transformer_lab.checks._common.load_weights`:
    each weight's name and shape checked), in float64 for a float64 ``x``."""
    load_weights(module, weights, what, **layout)
    if x.dtype == torch.float64:
        module.double()


def _mode(seed: int | None) -> str:
    return "" if seed is None else f" in training mode (dropout masks drawn from seed {seed})"


def _ff_what(d_ff: int, p: float, weights: Any, x: Tensor, seed: int | None) -> str:
    shown = f", dropout={p:g}" if p else ""
    dtype = "" if x.dtype == torch.float32 else f" ({x.dtype})"
    return (
        f"FeedForward({x.shape[-1]}, {d_ff}{shown})(x) on x of shape {tuple(x.shape)}{dtype}"
        f"{_mode(seed)}"
    )


def _ff_call(
    cls: Callable[..., Any], d_ff: int, p: float, weights: Any, x: Tensor, seed: int | None
) -> Tensor:
    """The student's FeedForward built for the case (from a fixed seed), the case's weights
    loaded (their names and shapes are the layer check), run on ``x``."""
    what = f"FeedForward({x.shape[-1]}, {d_ff}" + (f", dropout={p:g})" if p else ")")
    with seeded(0):
        ff = expect_module(call_student(cls, x.shape[-1], d_ff, dropout=p, what=what), what)
    layout = "self.linear1 = nn.Linear(d_model, d_ff), self.linear2 = nn.Linear(d_ff, d_model)"
    _built(ff, weights, x, what, layout=layout)
    got = run_module(ff, x, {}, what, ban=FEED_FORWARD_BAN, seed=seed)
    return expect_shape(got, tuple(x.shape), _ff_what(d_ff, p, weights, x, seed))


#: ``FeedForward``: a case is ``(d_ff, dropout, weights, x, seed)``, ``seed`` ``None`` in eval
#: mode; the student's module is built, given the case's weights and run.
FEED_FORWARD = Ordinary(
    _LAB,
    call=_ff_call,
    what=_ff_what,
    rule="Expected linear2(relu(linear1(x))), every token on its own; in training mode one "
    "nn.Dropout on the hidden units (d_ff wide, after the ReLU, before linear2), none in eval "
    "mode.",
    **_FLOATS,
)


def _by_mode(examples: list[Given], seed_at: int) -> list[list[Given]]:
    """Worked examples in eval mode, then those in training mode (``args[seed_at]`` set)."""
    return [[e for e in examples if (e.args[seed_at] is not None) == t] for t in (False, True)]


def check_feed_forward(cls: Callable[..., nn.Module]) -> None:
    """Layer names and sizes; stored worked examples in eval mode, then in training mode
    (dropout's masks drawn from one seed, as ``nn.TransformerEncoderLayer`` draws them)."""
    for examples in _by_mode(FEED_FORWARD.examples("check_feed_forward"), -1):
        FEED_FORWARD.judge(cls, examples)


#: norm1 and norm2 one module (``self.norm2 = self.norm1``), which the judge mirrors as such.
SHARED_NORM = (
    "one and the same LayerNorm (an alias, as self.norm2 = self.norm1 makes): each sub-layer "
    "needs its own nn.LayerNorm(d_model), with its own weight and bias."
)


def build_block(
    cls: Callable[..., Any],
    d_model: int,
    n_heads: int,
    d_ff: int,
    *,
    norm_first: bool,
    dropout: float = 0.0,
) -> tuple[nn.Module, str]:
    """``cls(d_model, n_heads, d_ff, dropout=..., norm_first=...)`` (from a fixed seed), its
    sub-layers' names checked (:func:`_built` checks each weight's name and shape)."""
    what = f"EncoderBlock({d_model}, {n_heads}, {d_ff}" + (
        f", dropout={dropout:g}" if dropout else ""
    )
    what += ", norm_first=True)" if norm_first else ")"
    with seeded(0):
        block = call_student(
            cls, d_model, n_heads, d_ff, dropout=dropout, norm_first=norm_first, what=what
        )
    expect_module(block, what)
    missing = [n for n in ("self_attn", "ff", "norm1", "norm2") if not hasattr(block, n)]
    if missing:
        raise AssertionError(
            f"{what} has no attribute(s) {', '.join(missing)}: the checks read self.self_attn "
            "(MultiHeadAttention), self.ff (your FeedForward, with linear1 and linear2), "
            "self.norm1 (the attention sub-layer's norm) and self.norm2 (the feed-forward's)."
        )
    if block.norm1 is block.norm2:
        note_mistake(SHARED_NORM)
        raise AssertionError(f"{what}.norm1 and {what}.norm2 are {SHARED_NORM}")
    return block, what


def sequence_first(cls: Callable[..., Any]) -> bool:
    """Whether the student's block attends with ``nn.MultiheadAttention(batch_first=True)``,
    whose output is a ``(T, B, D)`` tensor seen as ``(B, T, D)``: dropout draws its mask in
    memory order, so the attention output's dropout mask is drawn in that order."""
    block, _ = build_block(cls, 4, 1, 4, norm_first=False)
    return isinstance(block.self_attn, nn.MultiheadAttention)


@contextlib.contextmanager
def _no_attention_dropout(module: nn.Module) -> Iterator[None]:
    """Switch off dropout inside a block's attention module (on its weights, lab 03's business)
    while it runs: these checks test the block's own dropout."""
    saved: list[tuple[Any, str, float]] = []
    attn = getattr(module, "self_attn", None)
    for sub in attn.modules() if attn is not None else ():
        if isinstance(sub, nn.Dropout):
            saved.append((sub, "p", sub.p))
            sub.p = 0.0
    value = getattr(attn, "dropout", None)
    if isinstance(value, float) and value != 0.0:  # (a judged module's write is a request)
        saved.append((attn, "dropout", value))
        attn.dropout = 0.0
    try:
        yield
    finally:
        for owner, name, old in saved:
            setattr(owner, name, old)


class BlockCase(NamedTuple):
    """One case of the block's checks: the arguments the student's class is judged on."""

    n_heads: int
    d_ff: int
    norm_first: bool
    p: float  # the block's dropout
    w: Mapping[str, Tensor]  # weights in the kit's layout (self_attn.q_proj.weight, ...)
    x: Tensor  # (B, T, D)
    mask: Tensor | None  # (B, 1, 1, T) or (B, 1, T, T), True where a key may be attended to
    seed: int | None = None  # None in eval mode, else the seed dropout draws its masks from
    seq_first: bool = False  # the attention's output is (T, B, D) seen as (B, T, D)


def _block_what(*case: Any) -> str:
    c = BlockCase(*case)
    shown = (f", dropout={c.p:g}" if c.p else "") + (", norm_first=True" if c.norm_first else "")
    dtype = "" if c.x.dtype == torch.float32 else f" ({c.x.dtype})"
    call = f"x{'' if c.mask is None else ', mask'}"
    return (
        f"EncoderBlock({c.x.shape[-1]}, {c.n_heads}, {c.d_ff}{shown})({call}) on x of shape "
        f"{tuple(c.x.shape)}{dtype}{_mode(c.seed)}"
    )


def _block_call(cls: Callable[..., Any], *case: Any) -> Tensor:
    """The student's block built for the case, the case's weights loaded, run on ``x`` (in
    training mode with dropout drawn from ``seed``, or in eval mode)."""
    c = BlockCase(*case)
    d = c.x.shape[-1]
    block, what = build_block(cls, d, c.n_heads, c.d_ff, norm_first=c.norm_first, dropout=c.p)
    _built(block, c.w, c.x, what)
    got = run_module(block, c.x, {"mask": c.mask}, what, ban=BLOCK_BAN, seed=c.seed)
    return expect_shape(got, tuple(c.x.shape), _block_what(*case))


def _form(case: Case[Given]) -> str:
    if BlockCase(*case.input.args).norm_first:
        return (
            "Expected pre-norm: x = x + self_attn(norm1(x)), then x = x + ff(norm2(x)) (each "
            "sub-layer reads a normalised copy; the residual path itself is never normalised)."
        )
    return (
        "Expected post-norm ('Add & Norm'): x = norm1(x + self_attn(x)), then x = norm2(x + ff(x))."
    )


#: ``EncoderBlock``: a case is a :class:`BlockCase`.
BLOCK = Ordinary(
    _LAB,
    call=_block_call,
    what=_block_what,
    rule=_form,
    **_FLOATS,
)


def check_encoder_block(cls: Callable[..., nn.Module]) -> None:
    """Attribute names; stored worked examples in eval mode, post-norm (two sizes, with and
    without a padding mask), then pre-norm, each form diagnosed on its own."""
    examples = BLOCK.examples("check_encoder_block")
    for norm_first in (False, True):
        BLOCK.judge(cls, [e for e in examples if BlockCase(*e.args).norm_first == norm_first])


def check_encoder_block_dropout(cls: Callable[..., nn.Module]) -> None:
    """Stored worked examples with dropout 0.5 (post- and pre-norm): in eval mode, then in
    training mode, the masks drawn from one seed where ``nn.TransformerEncoderLayer`` draws them
    (attention output, hidden units, output), in the student's attention's memory order."""
    seq_first = sequence_first(cls)
    cases = [(e, BlockCase(*e.args)) for e in BLOCK.examples("check_encoder_block_dropout")]
    ours = [e for e, c in cases if c.seq_first == (seq_first and c.seed is not None)]
    for mode in _by_mode(ours, BlockCase._fields.index("seed")):
        BLOCK.judge(cls, mode)


def build_module(cls: Callable[..., Any], model: nn.Module, **hparams: Any) -> Any:
    """``cls(model, **hparams)``: the student's LightningModule around a given model."""
    shown = ", ".join(f"{k}={v!r}" for k, v in hparams.items())
    what = f"TaggingModule(model, {shown})"
    return expect_module(call_student(cls, model, what=what, **hparams), what)


def training_step_check(
    cls: Callable[..., Any],
    model: nn.Module,
    batch: dict[str, Tensor],
    expected: Tensor,
    mistakes: Mapping[str, Tensor],
) -> Tensor:
    """``training_step`` of ``cls(model, ...)`` on ``batch``: the loss (``expected``, a
    catalogued wrong loss named), its graph, what is logged (:func:`judge_training_step`,
    shared with lab 06); returns the loss it returned."""
    module = build_module(cls, model, lr=0.01, weight_decay=0.1, warmup_steps=4, total_steps=12)
    return judge_training_step(
        module,
        batch,
        ban=MODULE_BAN,
        expected=expected,
        mistakes=[(wrong, hint) for hint, wrong in mistakes.items()],
        hint="Expected F.cross_entropy of model(tokens, padding_mask)'s logits flattened to (B*T, "
        "C) and the targets to (B*T,), averaged over the real tokens (it ignores the -100s).",
    )


def check_training_step(cls: Callable[..., Any]) -> None:
    """``training_step`` of a module around a :class:`ProbeModel` with stored weights, on a
    stored batch with padding: the loss, its graph, what is logged."""
    with seeded(0):
        model = ProbeModel(6, 4, 6)
    weights = {k: stored(_LAB, f"training_step {k}")[0] for k in model.state_dict()}
    load_weights(model, weights, "ProbeModel(6, 4, 6)")
    got = {k: stored(_LAB, f"training_step {k}")[0] for k in ("tokens", "padding_mask", "targets")}
    batch = {k: v.bool() if k == "padding_mask" else v.long() for k, v in got.items()}
    training_step_check(cls, model, batch, *stored(_LAB, "training_step loss"))


@portable
class ProbeModel(nn.Module):
    """A small tagging model with every kind of parameter (an embedding, a layer norm, linear
    layers with and without bias) whose logits depend on the tokens and on the padding mask:
    each token sees the mean of the real tokens of its sequence (all tokens without a mask)."""

    def __init__(self, vocab_size: int = 7, d_model: int = 4, num_classes: int = 5) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.norm = nn.LayerNorm(d_model)
        self.mix = nn.Linear(d_model, d_model, bias=False)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, tokens: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        h = self.norm(self.embed(tokens))  # (B, T, D)
        real = torch.ones_like(tokens) if padding_mask is None else padding_mask
        real = real.to(h.dtype)[..., None]  # (B, T, 1)
        context = (h * real).sum(1, keepdim=True) / real.sum(1, keepdim=True).clamp(min=1.0)
        return self.head(torch.tanh(self.mix(h + 2.0 * context)))  # (B, T, C)


def optimizers_check(
    cls: Callable[..., Any],
    model: nn.Module,
    schedule: Schedule,
    weight_decay: float,
    expected: Tensor,
    mistakes: Mapping[str, Tensor],
) -> None:
    """``configure_optimizers`` of ``cls(model, ...)``: AdamW's two groups and the exact rates
    (``expected``, a catalogued wrong schedule named), stepped per step (shared with lab 06)."""
    hparams = {"lr": schedule.lr, "weight_decay": weight_decay, **schedule._asdict()}
    judge_configure_optimizers(
        build_module(cls, model, **hparams),
        model,
        schedule,
        ban=MODULE_BAN,
        weight_decay=weight_decay,
        expected=expected,
        mistakes=[(rates, hint) for hint, rates in mistakes.items()],
    )


def check_configure_optimizers(cls: Callable[..., Any]) -> None:
    """AdamW with two parameter groups and the warm-up + cosine schedule, stepped per step."""
    with seeded(0):
        model = ProbeModel()
    schedule = Schedule(lr=0.01, warmup_steps=4, total_steps=12)
    want, mistakes = stored(_LAB, f"configure_optimizers learning rates {schedule}")
    optimizers_check(cls, model, schedule, 0.1, want, mistakes)


@torch.no_grad()
def accuracy_on_fresh_data(model: nn.Module, batches: Sequence[dict[str, Tensor]]) -> float:
    """Token accuracy of a tagging model on ``batches`` of tokens, padding_mask and targets
    of one length (:func:`held_out_batches`); positions whose target is ``-100`` do not count."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    predicted = [
        model(b["tokens"].to(device), b["padding_mask"].to(device)).argmax(-1).cpu()  # (b, T)
        for b in batches
    ]
    model.train(was_training)
    targets = torch.cat([b["targets"] for b in batches])  # (N, T)
    scored = targets != IGNORE_INDEX
    if not bool(scored.any()):
        raise ValueError("accuracy_on_fresh_data got batches without any scored target")
    return float((torch.cat(predicted)[scored] == targets[scored]).double().mean())


def held_out_batches(
    task: str = "sort",
    *,
    n: int = 512,
    batch_size: int = 128,
    seed: int = 2024,
    **options: Any,
) -> list[dict[str, Tensor]]:
    """``ceil(n / batch_size)`` fresh tagging batches (``tokens``, ``padding_mask``, ``targets``
    ``(b, T)``) of a synthetic task, from a seed no training split uses; ``options`` go to
    ``make_task`` (``seq_len=8``, ``min_len=4``, ``num_symbols=10`` unless given)."""
    from transformer_lab.data.synthetic import make_task

    options = {"seq_len": 8, "min_len": 4, "num_symbols": 10, **options}
    g = torch.Generator().manual_seed(seed)
    data = make_task(task, n, format="tagging", generator=g, **options)
    return [{k: v[i : i + batch_size] for k, v in data.items()} for i in range(0, n, batch_size)]


def check_trained_encoder(
    model: nn.Module, block_cls: type, *, min_accuracy: float, task: str = "sort", **options: Any
) -> float:
    """The trained ``EncoderClassifier`` is built from the student's blocks (``block_cls``) and
    reaches ``min_accuracy`` token accuracy on new sequences of the notebook's task (``options``:
    its ``seq_len``, ``min_len``, ``num_symbols``); returns the accuracy it measured."""
    expect_true(
        isinstance(model, nn.Module),
        f"`model` should be your trained EncoderClassifier, got {type(model).__name__}: did the "
        "training cell run?",
    )
    expect_true(
        any(isinstance(m, block_cls) for m in model.modules()),
        "your model contains none of your EncoderBlocks: build it with "
        "EncoderClassifier(config, blocks=[EncoderBlock(...) for _ in range(n_layers)]).",
    )
    acc = accuracy_on_fresh_data(model, held_out_batches(task, **options))
    expect_true(
        acc >= min_accuracy,
        f"your encoder reaches {acc:.1%} token accuracy on new {task} sequences, expected at least "
        f"{min_accuracy:.0%}: check that the training cell ran to the end, that your blocks and "
        "TaggingModule pass their checks, and that the mask reaches self_attn.",
    )
    return acc
