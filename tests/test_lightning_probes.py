"""Labs 04 and 06 judge ``configure_optimizers`` alike where their contracts agree.

Both labs ask for AdamW whose learning rate warms up and decays step by step; the shared part of
that judgement is written once (:mod:`transformer_lab.checks._lightning`). The same wrong
``configure_optimizers`` is put into lab 04's ``TaggingModule`` and lab 06's
``TranslationModule`` (the tests' correct answers, with their own hyper-parameter names), and
each lab's visible and hidden configure_optimizers checks must fail it with the same words.
Before the shared module, lab 06 read the learning rate of parameter group 0 only, so two
groups on two schedules passed there and failed in lab 04.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import test_lab04_checks as t04
import test_lab06_checks as t06
import torch
from check_support import run_checks
from torch.optim.lr_scheduler import LambdaLR

from transformer_lab.checks import lab04, lab06
from transformer_lab.checks._lightning import (
    judge_stepped_per_step,
    learning_rates,
    parse_optimizers,
)
from transformer_lab.grading.hidden import lab04 as hidden04


def _hparams(module: Any) -> tuple[float, float, int, int]:
    """``(lr, weight_decay, warmup_steps, total_steps)`` of either lab's module."""
    if hasattr(module, "total_steps"):  # lab 06 keeps them as attributes
        return module.lr, 0.01, module.warmup_steps, module.total_steps
    hp = module.hparams
    return hp.lr, hp.weight_decay, hp.warmup_steps, hp.total_steps


def _decay_groups(module: Any, weight_decay: float) -> list[dict[str, Any]]:
    params = [p for p in module.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def two_schedules(module: Any) -> Any:
    """The matrices warm up and decay; the vectors keep the peak rate throughout."""
    lr, decay, w, n = _hparams(module)
    optimizer = torch.optim.AdamW(_decay_groups(module, decay), lr=lr)
    scheduler = LambdaLR(optimizer, [t04._lambda(w, n), lambda step: 1.0])
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def every_other_step(module: Any) -> Any:
    """The right schedule, stepped every second optimizer step."""
    lr, decay, w, n = _hparams(module)
    optimizer = torch.optim.AdamW(_decay_groups(module, decay), lr=lr)
    scheduler = LambdaLR(optimizer, t04._lambda(w, n))
    return {
        "optimizer": optimizer,
        "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 2},
    }


def optimizer_only(module: Any) -> Any:
    """AdamW with no schedule at all."""
    lr, decay, _, _ = _hparams(module)
    return torch.optim.AdamW(_decay_groups(module, decay), lr=lr)


def matrices_only(module: Any) -> Any:
    """The right schedule over the weight matrices alone (biases and norms never train)."""
    lr, decay, w, n = _hparams(module)
    groups = _decay_groups(module, decay)[:1]
    optimizer = torch.optim.AdamW(groups, lr=lr)
    scheduler = LambdaLR(optimizer, t04._lambda(w, n))
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def lambda_right(module: Any) -> Any:
    """Correct in both labs: two decay groups, one warm-up + cosine, stepped per step."""
    lr, decay, w, n = _hparams(module)
    optimizer = torch.optim.AdamW(_decay_groups(module, decay), lr=lr)
    scheduler = LambdaLR(optimizer, t04._lambda(w, n))
    return [optimizer], [{"scheduler": scheduler, "interval": "step"}]


def _in_lab(base: type, configure: Callable[[Any], Any]) -> type:
    return type(
        f"{base.__name__}_{configure.__name__}", (base,), {"configure_optimizers": configure}
    )


LABS: dict[str, tuple[type, dict[str, Callable[[Any], None]]]] = {
    "lab04": (t04.TaggingModule, t04.OPTIM_CHECKS),
    "lab06": (
        t06.Module,
        {
            "visible": lab06.check_configure_optimizers,
            "hidden": lambda cls: lab06.check_configure_optimizers(
                cls, lr=1e-3, warmup_steps=7, total_steps=60, seed=5
            ),
        },
    ),
}

MISTAKES = [
    (two_schedules, "different learning rates"),
    (every_other_step, "every 2 step(s)"),
    (optimizer_only, "without a learning-rate scheduler"),
    (matrices_only, "the optimizer does not update"),
]


@pytest.mark.parametrize("lab", list(LABS))
@pytest.mark.parametrize(("configure", "words"), MISTAKES, ids=[m.__name__ for m, _ in MISTAKES])
def test_one_mistake_fails_both_labs_with_the_same_words(
    lab: str, configure: Callable[[Any], Any], words: str
) -> None:
    base, checks = LABS[lab]
    outcomes = run_checks(checks, _in_lab(base, configure))
    assert all(words in message for message in outcomes.values()), outcomes


@pytest.mark.parametrize("lab", list(LABS))
def test_a_configuration_right_for_both_passes_both(lab: str) -> None:
    base, checks = LABS[lab]
    assert run_checks(checks, _in_lab(base, lambda_right)) == dict.fromkeys(checks, "")


def test_per_epoch_names_the_epoch() -> None:
    optimizer = torch.optim.AdamW(lab04.ProbeModel().parameters())
    conf = {"optimizer": optimizer, "lr_scheduler": LambdaLR(optimizer, lambda s: 1.0)}
    config = parse_optimizers(conf)
    assert (config.interval, config.frequency) == ("epoch", 1)
    with pytest.raises(AssertionError, match=r"every 1 epoch\(s\), once per EPOCH,"):
        judge_stepped_per_step(config.interval, config.frequency)


@pytest.mark.parametrize(
    ("returned", "words"),
    [
        (lambda o, s: 3, "find no optimizer"),
        (lambda o, s: [o], "without a learning-rate scheduler"),
        (lambda o, s: ([o, o], [s]), "one optimizer and one scheduler"),
        (lambda o, s: {"optimizer": o, "lr_scheduler": "cosine"}, "gave str as the scheduler"),
    ],
)
def test_returns_lightning_would_not_run_are_named(returned: Callable, words: str) -> None:
    optimizer = torch.optim.AdamW(lab04.ProbeModel().parameters())
    scheduler = LambdaLR(optimizer, lambda s: 1.0)
    with pytest.raises(AssertionError, match=words):
        parse_optimizers(returned(optimizer, scheduler))


@pytest.mark.parametrize(
    "form",
    [
        lambda o, s: {"optimizer": o, "lr_scheduler": {"scheduler": s, "interval": "step"}},
        lambda o, s: ([o], [{"scheduler": s, "interval": "step"}]),
        lambda o, s: [{"optimizer": o, "lr_scheduler": {"scheduler": s, "interval": "step"}}],
    ],
)
def test_every_form_lightning_accepts_reads_the_same(form: Callable) -> None:
    optimizer = torch.optim.AdamW(lab04.ProbeModel().parameters(), lr=0.02)
    scheduler = LambdaLR(optimizer, t04._lambda(5, 17))
    config = parse_optimizers(form(optimizer, scheduler))
    assert (config.optimizer, config.scheduler, config.interval) == (optimizer, scheduler, "step")
    torch.testing.assert_close(
        learning_rates(config.optimizer, config.scheduler, 17),
        hidden04.oracle_learning_rates(0.02, 5, 17),
    )
