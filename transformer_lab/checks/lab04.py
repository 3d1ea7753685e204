"""Visible checks of lab 04 (the transformer block): each part runs the student's answer, under
the spec's bans, on worked examples stored from the hidden oracles (``fixtures/lab04.json``).
A module is built from the case's sizes, given the case's weights and run in eval mode, or in
training mode with dropout drawn from the case's seed.

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
    expect_module,
    expect_shape,
    expect_true,
    load_weights,
    note_mistake,
    stored,
)
from transformer_lab.checks._generated import Given, Ordinary, floats_at
from transformer_lab.checks._lightning import (
    Schedule,
    build_module,
    judge_configure_optimizers,
    judge_training_step,
    learning_rates,
    parse_optimizers,
)
from transformer_lab.judge.mirror import portable

IGNORE_INDEX = -100

#: The lab's spec (``specs/lab04.toml``): its bans and shared tolerances.
SPEC = spec.load("04_transformer_block")
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


#: What every part here compares: float tensors (float64 when stored), at the spec's tolerance.
_FLOATS = floats_at(SPEC.tol("float32"))


def _on(call: str, x: Tensor, mode: str = "") -> str:
    """A call on a case as a message shows it: ``x``'s shape, its dtype unless float32."""
    dtype = "" if x.dtype == torch.float32 else f" ({x.dtype})"
    return f"{call} on x of shape {tuple(x.shape)}{dtype}{mode}"


def _mode(seed: int | None) -> str:
    return " in eval mode" if seed is None else f" in training mode (dropout from seed {seed})"


def _ctor(name: str, *sizes: int, dropout: float = 0.0, norm_first: bool = False) -> str:
    shown = (f", dropout={dropout:g}" if dropout else "") + (", norm_first=True" * norm_first)
    return f"{name}({', '.join(map(str, sizes))}{shown})"


def _ln_what(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> str:
    return _on(f"layer_norm(x, weight, bias{'' if eps == 1e-5 else f', eps={eps:g}'})", x)


def layer_norm_call(
    fn: Callable[..., Any], x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5
) -> Tensor:
    """The student's ``layer_norm`` under the lab's ban: a tensor of ``x``'s shape."""
    what = _ln_what(x, weight, bias, eps)
    got = call_forbidding(
        fn,
        (x.clone(), weight.clone(), bias.clone()),
        {} if eps == 1e-5 else {"eps": eps},
        ban=SPEC.ban("layer_norm"),
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
    module: nn.Module, what: str, x: Tensor, kwargs: dict[str, Any], *, ban: Ban, seed: int | None
) -> Tensor:
    """``module(x, **kwargs)`` under ``ban``, in float64 for a float64 ``x``, in training mode
    with dropout drawn from ``seed`` (else in eval mode), its attention's own dropout off: a
    tensor of ``x``'s shape."""
    if x.dtype == torch.float64:
        module.double()
    module.train(seed is not None)
    attn = getattr(module, "self_attn", None)  # its dropout acts on weights: lab 03's business
    for sub in attn.modules() if attn is not None else ():
        if isinstance(sub, nn.Dropout):
            sub.p = 0.0
    if isinstance(getattr(attn, "dropout", None), float) and attn.dropout:  # nn.MultiheadAttention
        attn.dropout = 0.0
    shown = "".join(f", {name}" for name, value in kwargs.items() if value is not None)
    call = _on(f"{what}(x{shown})", x, _mode(seed))
    with seeded(0 if seed is None else seed), torch.no_grad():  # eval: a dropout left on, named
        got = call_forbidding(module, (x.clone(),), kwargs, ban=ban, what=call)
    return expect_shape(got, tuple(x.shape), call)


def _ff_call(
    cls: Callable[..., Any], d_ff: int, p: float, weights: Any, x: Tensor, seed: int | None
) -> Tensor:
    """The student's FeedForward built for the case, given its weights, run on ``x``."""
    what = _ctor("FeedForward", x.shape[-1], d_ff, dropout=p)
    with seeded(0):
        ff = expect_module(call_student(cls, x.shape[-1], d_ff, dropout=p, what=what), what)
    load_weights(ff, weights, what, SPEC.parts["FeedForward"].layout)  # names and sizes
    return run_module(ff, what, x, {}, ban=SPEC.ban("feed_forward"), seed=seed)


#: ``FeedForward``: a case is ``(d_ff, dropout, weights, x, seed)``, ``seed`` ``None`` in eval
#: mode; the student's module is built, given the case's weights and run.
FEED_FORWARD = Ordinary(
    _LAB,
    call=_ff_call,
    what=lambda d_ff, p, w, x, seed: _on(
        f"{_ctor('FeedForward', x.shape[-1], d_ff, dropout=p)}(x)", x, _mode(seed)
    ),
    rule="Expected linear2(relu(linear1(x))), every token on its own; in training mode one "
    "nn.Dropout on the hidden units (d_ff wide, after the ReLU, before linear2), none in eval "
    "mode.",
    **_FLOATS,
)


def _judge_by(part: Ordinary, cls: Any, examples: list[Given], key: Callable[..., Any]) -> None:
    """``part`` judges ``cls`` on the examples of each value of ``key(*args)`` on their own."""
    for value in dict.fromkeys(key(*e.args) for e in examples):
        part.judge(cls, [e for e in examples if key(*e.args) == value])


def check_feed_forward(cls: Callable[..., nn.Module]) -> None:
    """Layer names and sizes; stored worked examples in eval mode, then in training mode
    (dropout's masks drawn from one seed, as ``nn.TransformerEncoderLayer`` draws them)."""
    examples = FEED_FORWARD.examples("check_feed_forward")
    _judge_by(FEED_FORWARD, cls, examples, lambda *case: case[-1] is not None)


#: norm1 and norm2 one module (``self.norm2 = self.norm1``), which the judge mirrors as such.
SHARED_NORM = (
    "one and the same LayerNorm (an alias, as self.norm2 = self.norm1 makes): each sub-layer "
    "needs its own nn.LayerNorm(d_model), with its own weight and bias."
)


def build_block(
    cls: Callable[..., Any], d_model: int, n_heads: int, d_ff: int, **options: Any
) -> tuple[nn.Module, str]:
    """The student's block (from a fixed seed), its sub-layers' names checked."""
    what = _ctor("EncoderBlock", d_model, n_heads, d_ff, **options)
    with seeded(0):
        block = expect_module(call_student(cls, d_model, n_heads, d_ff, what=what, **options), what)
    layers = SPEC.parts["EncoderBlock"]
    missing = [name for name in layers.attribute_names if not hasattr(block, name)]
    if missing:
        raise AssertionError(
            f"{what} has no attribute(s) {', '.join(missing)}: the checks read {layers.layout}."
        )
    if block.norm1 is block.norm2:
        note_mistake(SHARED_NORM)
        raise AssertionError(f"{what}.norm1 and {what}.norm2 are {SHARED_NORM}")
    return block, what


def sequence_first(cls: Callable[..., Any]) -> bool:
    """Whether the block attends with ``nn.MultiheadAttention``, whose output is a ``(T, B, D)``
    tensor seen as ``(B, T, D)`` (dropout draws its mask in that memory order)."""
    return isinstance(build_block(cls, 4, 1, 4)[0].self_attn, nn.MultiheadAttention)


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
    block = _ctor(
        "EncoderBlock", c.x.shape[-1], c.n_heads, c.d_ff, dropout=c.p, norm_first=c.norm_first
    )
    return _on(f"{block}(x{'' if c.mask is None else ', mask'})", c.x, _mode(c.seed))


def _block_call(cls: Callable[..., Any], *case: Any) -> Tensor:
    """The student's block built for the case, given its weights, run on ``x``."""
    c = BlockCase(*case)
    block, what = build_block(
        cls, c.x.shape[-1], c.n_heads, c.d_ff, dropout=c.p, norm_first=c.norm_first
    )
    load_weights(block, c.w, what)
    return run_module(block, what, c.x, {"mask": c.mask}, ban=BLOCK_BAN, seed=c.seed)


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
BLOCK = Ordinary(_LAB, call=_block_call, what=_block_what, rule=_form, **_FLOATS)


def check_encoder_block(cls: Callable[..., nn.Module]) -> None:
    """Attribute names; stored worked examples in eval mode, post-norm (two sizes, with and
    without a padding mask), then pre-norm, each form diagnosed on its own."""
    examples = BLOCK.examples("check_encoder_block")
    _judge_by(BLOCK, cls, examples, lambda *case: BlockCase(*case).norm_first)


def check_encoder_block_dropout(cls: Callable[..., nn.Module]) -> None:
    """Stored worked examples with dropout 0.5 (post- and pre-norm): in eval mode, then in
    training mode, the masks drawn from one seed where ``nn.TransformerEncoderLayer`` draws them
    (attention output, hidden units, output), in the student's attention's memory order."""
    seq_first = sequence_first(cls)
    cases = [(e, BlockCase(*e.args)) for e in BLOCK.examples("check_encoder_block_dropout")]
    ours = [e for e, c in cases if c.seq_first == (seq_first and c.seed is not None)]
    _judge_by(BLOCK, cls, ours, lambda *case: BlockCase(*case).seed is not None)


def training_step_check(
    cls: Any, model: nn.Module, batch: dict[str, Tensor], loss: tuple[Tensor, Mapping[str, Any]]
) -> Tensor:
    """``training_step`` of ``cls(model, ...)`` on ``batch``: the loss (``(expected, {hint:
    wrong loss})``), its graph, what is logged (:func:`judge_training_step`); returns the loss."""
    hparams = {"lr": 0.01, "weight_decay": 0.1, "warmup_steps": 4, "total_steps": 12}
    module = build_module(cls, "TaggingModule", model, ban=MODULE_BAN, **hparams)
    return judge_training_step(
        module,
        batch,
        ban=MODULE_BAN,
        expected=loss[0],
        mistakes=[(wrong, hint) for hint, wrong in loss[1].items()],
        hint="Expected F.cross_entropy of model(tokens, padding_mask)'s logits flattened to (B*T, "
        "C) and the targets to (B*T,), averaged over the real tokens (it ignores the -100s).",
    )


def check_training_step(cls: Callable[..., Any]) -> None:
    """``training_step`` on a stored padded batch: the loss, its graph, what is logged."""
    with seeded(0):
        model = ProbeModel(6, 4, 6)
    weights = {k: stored(_LAB, f"training_step {k}")[0] for k in model.state_dict()}
    load_weights(model, weights, "ProbeModel(6, 4, 6)")
    got = {k: stored(_LAB, f"training_step {k}")[0] for k in ("tokens", "padding_mask", "targets")}
    batch = {k: v.bool() if k == "padding_mask" else v.long() for k, v in got.items()}
    training_step_check(cls, model, batch, stored(_LAB, "training_step loss"))


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
    cls: Any, model: nn.Module, schedule: Schedule, weight_decay: float, rates: tuple[Tensor, Any]
) -> None:
    """``configure_optimizers``: AdamW's two groups, the ``rates`` (``(expected, {hint: wrong
    rates})``) stepped per step."""
    hparams = {"lr": schedule.lr, "weight_decay": weight_decay, **schedule._asdict()}
    judge_configure_optimizers(
        build_module(cls, "TaggingModule", model, ban=MODULE_BAN, **hparams),
        model,
        schedule,
        ban=MODULE_BAN,
        weight_decay=weight_decay,
        expected=rates[0],
        mistakes=[(wrong, hint) for hint, wrong in rates[1].items()],
    )


def check_configure_optimizers(cls: Callable[..., Any]) -> None:
    """AdamW with two parameter groups and the warm-up + cosine schedule, stepped per step."""
    with seeded(0):
        model = ProbeModel()
    schedule = Schedule(lr=0.01, warmup_steps=4, total_steps=12)
    rates = stored(_LAB, f"configure_optimizers learning rates {schedule}")
    optimizers_check(cls, model, schedule, 0.1, rates)


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
    return float((torch.cat(predicted)[scored] == targets[scored]).double().mean())


def held_out_batches(
    task: str = "sort", *, n: int = 512, seed: int = 2024, **options: Any
) -> list[dict[str, Tensor]]:
    """``ceil(n / 128)`` fresh tagging batches (``tokens``, ``padding_mask``, ``targets``
    ``(b, T)``) of a synthetic task, from a seed no training split uses; ``options`` go to
    ``make_task`` (``seq_len=8``, ``min_len=4``, ``num_symbols=10`` unless given)."""
    from transformer_lab.data.synthetic import make_task

    options = {"seq_len": 8, "min_len": 4, "num_symbols": 10, **options}
    g = torch.Generator().manual_seed(seed)
    data = make_task(task, n, format="tagging", generator=g, **options)
    return [{k: v[i : i + 128] for k, v in data.items()} for i in range(0, n, 128)]


def check_trained_encoder(
    model: nn.Module, block_cls: type, *, min_accuracy: float, task: str = "sort", **options: Any
) -> float:
    """The trained ``EncoderClassifier`` is built from the student's blocks (``block_cls``) and
    reaches ``min_accuracy`` token accuracy on new sequences of the notebook's task (``options``:
    its ``seq_len``, ``min_len``, ``num_symbols``); returns the accuracy it measured."""
    expect_true(
        isinstance(model, nn.Module) and any(isinstance(m, block_cls) for m in model.modules()),
        f"`model` ({type(model).__name__}) should be your trained EncoderClassifier made of your "
        "EncoderBlocks, EncoderClassifier(config, blocks=[EncoderBlock(...) for _ in "
        "range(n_layers)]): did the training cell run?",
    )
    acc = accuracy_on_fresh_data(model, held_out_batches(task, **options))
    expect_true(
        acc >= min_accuracy,
        f"your encoder reaches {acc:.1%} token accuracy on new {task} sequences, expected at least "
        f"{min_accuracy:.0%}: check that the training cell ran to the end, that your blocks and "
        "TaggingModule pass their checks, and that the mask reaches self_attn.",
    )
    return acc


__all__ = [*(n for n in dir() if n.startswith("check_")), "learning_rates", "parse_optimizers"]
