"""LightningModules: thin training wrappers around the kit's plain ``nn.Module`` models.

Each module owns exactly one model and adds what training needs around it: the loss, metrics,
the optimizer and its schedule, and checkpoint bookkeeping. The model itself stays a plain
PyTorch module from :mod:`transformer_lab.models`, so the same object can be used in a notebook,
by the benchmarks or by the decoding functions without Lightning.

* :class:`ClassifierModule`: an encoder with a token head (tagging tasks such as copy, reverse,
  sort: logits ``(B, T, C)``) or a sequence head (one label per sequence: logits ``(B, C)``).
* :class:`Seq2SeqModule`: an encoder-decoder trained with teacher forcing.
* :class:`CausalLMModule`: a decoder-only GPT trained on next-token prediction.

A module is built either from a config (the CLI and YAML files do this; ``vocab_size`` and the
other data-dependent fields are linked in from the DataModule) or from a ready model, e.g. one
assembled from a student's blocks::

    ClassifierModule(model=EncoderClassifier(cfg, blocks=my_blocks))

The pattern (``save_hyperparameters``, one ``_shared_step(batch, stage)`` logging
``f"{stage}_loss"``, a per-step schedule from ``configure_optimizers``) follows the Lightning
documentation and the UvA deep-learning tutorials (tutorial 6, Transformers).

What lab 04 grades are three public functions that the modules call, not the Lightning hooks
themselves, so a student package with lab 04 locked keeps every class whole:

* :func:`token_cross_entropy`: the loss, over the non-ignored positions, in float32;
* :func:`log_metrics`: the logging rule (``train_loss`` on written steps, ``{stage}_loss`` and
  the stage's metrics at epoch end);
* :func:`~transformer_lab.training.schedule.build_optimizer`: AdamW (Loshchilov & Hutter, 2019)
  with decay on matrices only, linear warm-up and cosine decay, stepped every step.

The encoder-decoder's loss is lab 06's :func:`~transformer_lab.seq2seq.sequence_loss`.
Checkpoint bookkeeping (what a checkpoint records, the refusal of another config's or task's
checkpoint) is :mod:`transformer_lab.training.checkpoints`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import GradClipAlgorithmType
from torch import Tensor, nn
from torchmetrics import MeanMetric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.text import Perplexity

from transformer_lab.graded import graded
from transformer_lab.models import (
    GPT,
    EncoderClassifier,
    EncoderConfig,
    GPTConfig,
    Seq2SeqConfig,
    Seq2SeqTransformer,
)
from transformer_lab.seq2seq import sequence_loss
from transformer_lab.training.checkpoints import (
    CHECKPOINT_KEY,
    CheckpointMismatchError,
    check_checkpoint_matches,
    checkpoint_record,
    describe_datamodule,
)
from transformer_lab.training.schedule import OptimConfig, build_optimizer

__all__ = [
    "CHECKPOINT_KEY",
    "CausalLMModule",
    "CheckpointMismatchError",
    "ClassifierModule",
    "OptimConfig",
    "Seq2SeqModule",
    "has_progress_bar",
    "is_written_step",
    "log_metrics",
    "token_cross_entropy",
]

IGNORE_INDEX = -100
# Metrics are computed on validation and test only: updating torchmetrics objects and logging
# them on every training step costs more than the step itself for the kit's small models.
STAGES = ("val", "test")


def _as_config(config: Any, cls: type) -> Any:
    """Accept a config dataclass or its ``asdict`` form (how checkpoints store it)."""
    if config is None or isinstance(config, cls):
        return config
    if isinstance(config, Mapping):
        return cls(**config)
    raise ValueError(f"config must be a {cls.__name__} or a mapping, got {type(config).__name__}")


def _config_dict(config: Any) -> dict[str, Any] | None:
    return None if config is None else dataclasses.asdict(config)


class _TransformerModule(L.LightningModule):
    """What all three modules share: optimizer, schedule, checkpoint checks, metric plumbing."""

    model: nn.Module
    config_class: type

    def __init__(
        self,
        config: Any,
        model: nn.Module | None,
        optim: OptimConfig | None,
        compile_model: bool = False,
    ) -> None:
        super().__init__()
        config = _as_config(config, self.config_class)
        if model is None and config is None:
            raise ValueError(f"{type(self).__name__} needs a config or a model (both are None)")
        if model is not None and config is None:
            config = getattr(model, "config", None)
            config = config if isinstance(config, self.config_class) else None
        self.config = config
        self.optim = _as_config(optim, OptimConfig) or OptimConfig()
        self.model = model if model is not None else self.build_model(config)
        # Store plain dicts: they round-trip through hparams.yaml and checkpoints without pickling
        # the dataclasses. The model instance itself is never a hyperparameter.
        self.save_hyperparameters(ignore=["model"])
        self.hparams["config"] = _config_dict(config)
        self.hparams["optim"] = dataclasses.asdict(self.optim)
        # Filled from the DataModule when training starts so checkpoints can rebuild the vocabulary.
        self.data_info: dict[str, Any] = {}
        self.compile_model = compile_model

    def configure_model(self) -> None:
        """Compile the model in place with ``torch.compile`` when ``compile_model`` is set.

        ``nn.Module.compile`` keeps the parameter names, so checkpoints of compiled and eager
        runs are interchangeable. Worth it on GPUs for long runs; on a CPU the compile time
        usually exceeds what a short run saves.
        """
        if self.compile_model and not getattr(self, "_compiled", False):
            self.model.compile()
            self._compiled = True

    def _required_config(self) -> Any:
        """The model's configuration, for modules whose metrics need its sizes."""
        cfg = self.config if self.config is not None else getattr(self.model, "config", None)
        if cfg is None:
            raise ValueError(
                f"{type(self).__name__} needs a model with a `config` "
                f"({self.config_class.__name__})"
            )
        return cfg

    def build_model(self, config: Any) -> nn.Module:
        raise NotImplementedError

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        return self.model(*args, **kwargs)

    def _metrics(self, stage: str) -> MetricCollection:
        return self.metrics[f"{stage}_metrics"]

    def stage_metrics(self, stage: str) -> MetricCollection | None:
        """The metrics of ``stage``: a collection for validation and test, ``None`` for training."""
        return self._metrics(stage) if stage in STAGES else None

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        return self._shared_step(batch, "train")

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        return self._shared_step(batch, "val")

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        return self._shared_step(batch, "test")

    def _shared_step(self, batch: dict[str, Tensor], stage: str) -> Tensor:
        raise NotImplementedError

    def configure_optimizers(self) -> dict[str, Any]:
        """AdamW and its warm-up + cosine schedule: :func:`.schedule.build_optimizer`."""
        # The Trainer's estimate of the run's length is only asked for when it is needed.
        needs_estimate = self.optim.total_steps is None
        estimate = self.trainer.estimated_stepping_batches if needs_estimate else None
        return build_optimizer(self.model, self.optim, estimate)

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip the gradients (``--trainer.gradient_clip_val``), also for the fused AdamW.

        Lightning's own clipping refuses any optimizer that unscales inside its step, as the
        fused AdamW does, even under bf16 where nothing is scaled at all. This hook clips the
        same way (norm or value, over the optimizer's parameters), after one extra step under
        fp16 mixed precision: the gradient scaler's ``unscale_``, which Lightning skips for such
        optimizers. The scaler then sees the gradients already unscaled and lets the fused step
        use only its inf/NaN check. Lightning calls this hook after backward, before the step.
        """
        if not gradient_clip_val:
            return
        plugin = self.trainer.precision_plugin
        scaler = getattr(plugin, "scaler", None)  # a GradScaler under 16-mixed, else None
        if scaler is not None and optimizer.defaults.get("fused"):
            scaler.unscale_(optimizer)
        if GradClipAlgorithmType(gradient_clip_algorithm or "norm") == GradClipAlgorithmType.VALUE:
            plugin.clip_grad_by_value(optimizer, gradient_clip_val)
        else:
            plugin.clip_grad_by_norm(optimizer, gradient_clip_val)

    # -- checkpoints -----------------------------------------------------------------------------

    def on_fit_start(self) -> None:
        self.data_info = describe_datamodule(getattr(self.trainer, "datamodule", None))

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[CHECKPOINT_KEY] = checkpoint_record(
            self, self.hparams.get("config"), self.data_info
        )

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer else None
        check_checkpoint_matches(checkpoint, self, datamodule)
        self.data_info = dict(checkpoint.get(CHECKPOINT_KEY, {}).get("data") or {})


@graded("04_transformer_block")
def token_cross_entropy(
    logits: Tensor, targets: Tensor, ignore_index: int = IGNORE_INDEX
) -> Tensor:
    """Mean cross-entropy over the positions whose target is not ``ignore_index``.

    The loss of every kit module: a token head (logits ``(B, T, C)``, targets ``(B, T)``), a
    sequence head (``(B, C)`` and ``(B,)``) or next-token prediction (``(B, T, V)``).

    Args:
        logits: ``(..., V)`` unnormalised scores.
        targets: ``(...)`` class ids, ``ignore_index`` where nothing is predicted.
        ignore_index: the target id that contributes nothing (``-100``, PyTorch's default).

    Returns:
        A scalar float32 tensor (a per-position mean over the whole batch).
    """
    vocab = logits.shape[-1]
    # Loss in float32 even under mixed precision: log-softmax over V in bf16 loses digits.
    return F.cross_entropy(
        logits.reshape(-1, vocab).float(),  # (B*T, V)
        targets.reshape(-1),  # (B*T,)
        ignore_index=ignore_index,
    )


def is_written_step(module: L.LightningModule) -> bool:
    """Whether the training step being taken is one Lightning writes to the loggers.

    Lightning writes logged values every ``trainer.log_every_n_steps`` steps, but each
    ``self.log`` call costs the same whether or not it is written: about 0.4 ms on the
    benchmarks' 2-core CPU, which doubles Lightning's own fixed cost per step (0.40 ->
    0.83 ms in ``benchmarks/bench_throughput.py --tiny``, 2026-12-01). That is about 1% of a
    laptop char-LM step and a few percent of the GPU recipe's launch-bound step, so the
    loss is logged with Lightning's own rule for when it writes (the step being taken
    counts). The progress bar shows the latest logged value. This is the kit's one
    departure from plain Lightning for speed.
    """
    trainer = module._trainer
    every = max(1, trainer.log_every_n_steps) if trainer is not None else 1
    return (module.global_step + 1) % every == 0


def has_progress_bar(module: L.LightningModule) -> bool:
    """Whether the module's trainer shows a progress bar (``enable_progress_bar``).

    A value logged with ``prog_bar=True`` is turned into a Python number by Lightning at the end
    of *every* training step (``.item()``, the last logged value included), whether or not a bar
    shows it: on a GPU that is a host-device synchronisation per step, which keeps the CPU from
    queueing the next step's kernels while the GPU works. Without a bar there is nothing to show,
    so the training loss goes to the loggers only, and a step of the kit's loop synchronises
    nowhere (``tests/test_training_sync.py`` counts it).
    """
    trainer = module._trainer
    return getattr(trainer, "progress_bar_callback", None) is not None


@graded("04_transformer_block")
def log_metrics(
    module: L.LightningModule,
    stage: str,
    loss: Tensor,
    batch_size: int,
    metrics: MetricCollection | None = None,
) -> None:
    """Log one step of ``stage`` (``"train"``, ``"val"`` or ``"test"``) from ``module``.

    Training logs ``train_loss`` on the steps Lightning writes (:func:`is_written_step`), shown
    in the progress bar when there is one (:func:`has_progress_bar`). Validation and test log
    ``{stage}_loss``, averaged over the epoch (weighted by ``batch_size``, over processes under
    DDP), and the stage's torchmetrics ``metrics``, which Lightning computes and resets at the
    end of the epoch.

    Args:
        module: the LightningModule whose ``log`` is called.
        stage: ``"train"``, ``"val"`` or ``"test"``.
        loss: the step's scalar loss.
        batch_size: the number of sequences in the step's batch.
        metrics: the stage's metric collection (validation and test), already updated.
    """
    if stage == "train":
        if is_written_step(module):
            bar = has_progress_bar(module)
            module.log("train_loss", loss, on_step=True, on_epoch=False, prog_bar=bar)
        return
    # Averaging the epoch loss over processes is only needed (and only paid) under DDP.
    distributed = module._trainer is not None and module._trainer.world_size > 1
    module.log(
        f"{stage}_loss",
        loss,
        on_epoch=True,
        prog_bar=True,
        batch_size=batch_size,
        sync_dist=distributed,
    )
    if metrics is not None:
        # Metric objects are computed and reset by Lightning at epoch end (no per-step sync).
        module.log_dict(metrics, on_step=False, on_epoch=True, prog_bar=True)


def _exact_match(predictions: Tensor, targets: Tensor, ignore_index: int) -> Tensor:
    """Per-sequence 1.0 where every non-ignored position is right; inputs ``(B, T)``."""
    correct = (predictions == targets) | (targets == ignore_index)  # (B, T)
    return correct.all(dim=-1).float()  # (B,)


class ClassifierModule(_TransformerModule):
    """Train an :class:`~transformer_lab.models.EncoderClassifier` (token or sequence head).

    Batches (``"tagging"``, see ``docs/contracts.md``): ``tokens (B, T)``, ``padding_mask (B, T)``
    (True at real tokens) and ``targets``: ``(B, T)`` with ``-100`` where nothing is predicted for
    a token head, ``(B,)`` for a sequence head.

    Logged: ``train_loss`` (every ``log_every_n_steps``), ``{stage}_loss``, and for validation
    and test ``{stage}_acc`` (token accuracy over non-ignored positions, or
    sequence accuracy for a sequence head) and ``{stage}_exact_match`` (token head: fraction of
    sequences with every position right).

    Args:
        config: model configuration (``vocab_size``/``max_len`` are linked from the DataModule
            by the CLI); ignored when ``model`` is given.
        model: a ready model, e.g. one built from a student's blocks.
        optim: optimizer and schedule settings.
        compile_model: compile the model with ``torch.compile`` before training (GPU runs).
    """

    config_class = EncoderConfig

    def __init__(
        self,
        config: EncoderConfig | None = None,
        model: nn.Module | None = None,
        optim: OptimConfig | None = None,
        compile_model: bool = False,
    ) -> None:
        super().__init__(config, model, optim, compile_model)
        num_classes = self._num_classes()
        self.metrics = nn.ModuleDict(
            {
                f"{stage}_metrics": MetricCollection(
                    {
                        "acc": MulticlassAccuracy(
                            num_classes, average="micro", ignore_index=IGNORE_INDEX
                        ),
                        "exact_match": MeanMetric(),
                    },
                    prefix=f"{stage}_",
                )
                for stage in STAGES
            }
        )

    def build_model(self, config: EncoderConfig) -> nn.Module:
        return EncoderClassifier(config)

    def _num_classes(self) -> int:
        config = self.config
        if config is not None:
            return config.num_classes if config.num_classes is not None else config.vocab_size
        head = getattr(self.model, "head", None)
        out = getattr(head, "out_features", None)
        if out is None:
            raise ValueError(
                "cannot tell the number of classes: pass a model with a `config` attribute "
                "(EncoderConfig) or an `nn.Linear` named `head`"
            )
        return int(out)

    def _shared_step(self, batch: dict[str, Tensor], stage: str) -> Tensor:
        tokens, targets = batch["tokens"], batch["targets"]
        logits = self.model(tokens, padding_mask=batch.get("padding_mask"))  # (B, T, C) | (B, C)
        loss = token_cross_entropy(logits, targets, IGNORE_INDEX)
        if stage in STAGES:
            predictions = logits.argmax(dim=-1)  # (B, T) | (B,)
            metrics = self._metrics(stage)
            metrics["acc"].update(predictions.reshape(-1), targets.reshape(-1))
            if targets.dim() == 2:
                metrics["exact_match"].update(_exact_match(predictions, targets, IGNORE_INDEX))
            else:
                metrics["exact_match"].update((predictions == targets).float())
        log_metrics(self, stage, loss, tokens.shape[0], self.stage_metrics(stage))
        return loss

    @torch.no_grad()
    def predict_batch(self, batch: dict[str, Tensor]) -> Tensor:
        """Argmax predictions ``(B, T)`` (token head) or ``(B,)`` (sequence head)."""
        logits = self.model(batch["tokens"], padding_mask=batch.get("padding_mask"))
        return logits.argmax(dim=-1)

    def predict_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        return self.predict_batch(batch)

    @torch.no_grad()
    def examples(self, batch: dict[str, Tensor], n: int) -> list[dict[str, Any]]:
        """The first ``n`` examples of ``batch`` as id lists: input, prediction, target.

        Token head: prediction and target cover the scored (non-ignored) positions. Sequence
        head: prediction and target are one class id each (``"labels": True``).
        """
        batch = {k: v[:n] for k, v in batch.items()}
        tokens, targets = batch["tokens"], batch["targets"]
        predictions = self.predict_batch(batch)  # (n, T) | (n,)
        mask = batch.get("padding_mask")
        rows = []
        for i in range(tokens.shape[0]):
            real = tokens[i] if mask is None else tokens[i][mask[i]]
            if targets.dim() == 1:
                prediction, target = [int(predictions[i])], [int(targets[i])]
            else:
                scored = targets[i] != IGNORE_INDEX
                prediction = predictions[i][scored].tolist()
                target = targets[i][scored].tolist()
            rows.append(
                {
                    "input": real.tolist(),
                    "prediction": prediction,
                    "target": target,
                    "labels": targets.dim() == 1,
                }
            )
        return rows


class Seq2SeqModule(_TransformerModule):
    """Train a :class:`~transformer_lab.models.Seq2SeqTransformer` with teacher forcing.

    Batches (``"seq2seq"``): ``src (B, S)``, ``src_padding_mask (B, S)``, ``tgt_in (B, T)``
    (starts with BOS), ``tgt_out (B, T)`` (ends with EOS, padded with ``pad_id``),
    ``tgt_padding_mask (B, T)``. Padding in ``tgt_out`` is ignored by the loss and the metrics.

    Logged: ``train_loss``, ``{stage}_loss``, and for validation and test ``{stage}_acc``
    (teacher-forced token accuracy) and
    ``{stage}_exact_match`` (every target token right under teacher forcing).

    Args:
        config: model configuration (vocabulary sizes, special ids and ``max_len`` are linked
            from the DataModule by the CLI); ignored when ``model`` is given.
        model: a ready model.
        optim: optimizer and schedule settings.
        compile_model: compile the model with ``torch.compile`` before training (GPU runs).
    """

    config_class = Seq2SeqConfig

    def __init__(
        self,
        config: Seq2SeqConfig | None = None,
        model: nn.Module | None = None,
        optim: OptimConfig | None = None,
        compile_model: bool = False,
    ) -> None:
        super().__init__(config, model, optim, compile_model)
        cfg = self._required_config()
        self.pad_id = int(cfg.pad_id)
        self.metrics = nn.ModuleDict(
            {
                f"{stage}_metrics": MetricCollection(
                    {
                        "acc": MulticlassAccuracy(
                            cfg.tgt_vocab_size, average="micro", ignore_index=self.pad_id
                        ),
                        "exact_match": MeanMetric(),
                    },
                    prefix=f"{stage}_",
                )
                for stage in STAGES
            }
        )

    def build_model(self, config: Seq2SeqConfig) -> nn.Module:
        return Seq2SeqTransformer(config)

    def _strip(self, ids: list[int]) -> list[int]:
        """Cut a target-side sequence at its EOS and drop BOS/padding."""
        cfg = self.model.config
        out = []
        for token in ids:
            if token == cfg.eos_id:
                break
            if token not in (cfg.bos_id, cfg.pad_id):
                out.append(token)
        return out

    @torch.no_grad()
    def examples(self, batch: dict[str, Tensor], n: int) -> list[dict[str, Any]]:
        """The first ``n`` examples of ``batch`` decoded greedily (no teacher forcing)."""
        from transformer_lab.generation import greedy_decode

        cfg = self.model.config
        src = batch["src"][:n]
        src_mask = batch.get("src_padding_mask")
        src_mask = None if src_mask is None else src_mask[:n]
        tgt_out = batch["tgt_out"][:n]
        decoded = greedy_decode(
            self.model, src, cfg.bos_id, cfg.eos_id, tgt_out.shape[1], src_padding_mask=src_mask
        )  # (n, <= T)
        rows = []
        for i in range(src.shape[0]):
            real = src[i] if src_mask is None else src[i][src_mask[i]]
            rows.append(
                {
                    "input": real.tolist(),
                    "prediction": self._strip(decoded[i].tolist()),
                    "target": self._strip(tgt_out[i].tolist()),
                    "labels": False,
                }
            )
        return rows

    def _shared_step(self, batch: dict[str, Tensor], stage: str) -> Tensor:
        tgt_out = batch["tgt_out"]
        logits = self.model(
            batch["src"],
            batch["tgt_in"],
            src_padding_mask=batch.get("src_padding_mask"),
            tgt_padding_mask=batch.get("tgt_padding_mask"),
        )  # (B, T, V_tgt)
        loss = sequence_loss(logits, tgt_out, self.pad_id)
        if stage in STAGES:
            predictions = logits.argmax(dim=-1)  # (B, T)
            metrics = self._metrics(stage)
            metrics["acc"].update(predictions.reshape(-1), tgt_out.reshape(-1))
            metrics["exact_match"].update(_exact_match(predictions, tgt_out, self.pad_id))
        log_metrics(self, stage, loss, tgt_out.shape[0], self.stage_metrics(stage))
        return loss


class CausalLMModule(_TransformerModule):
    """Train a decoder-only :class:`~transformer_lab.models.GPT` on next-token prediction.

    Batches (``"lm"``): ``tokens (B, T)`` and ``targets (B, T)`` (the tokens shifted by one,
    ``-100`` where ignored).

    Logged: ``train_loss``, ``{stage}_loss`` (nats per token), and for validation and test
    ``{stage}_acc`` (next-token accuracy) and
    ``{stage}_ppl`` (perplexity, ``exp`` of the mean loss over the epoch).

    Args:
        config: model configuration (``vocab_size`` and ``n_ctx`` are linked from the
            DataModule by the CLI); ignored when ``model`` is given.
        model: a ready model.
        optim: optimizer and schedule settings.
        compile_model: compile the model with ``torch.compile`` before training (GPU runs).
    """

    config_class = GPTConfig

    def __init__(
        self,
        config: GPTConfig | None = None,
        model: nn.Module | None = None,
        optim: OptimConfig | None = None,
        compile_model: bool = False,
    ) -> None:
        super().__init__(config, model, optim, compile_model)
        cfg = self._required_config()

        self.metrics = nn.ModuleDict(
            {
                f"{stage}_metrics": MetricCollection(
                    {
                        "acc": MulticlassAccuracy(
                            cfg.vocab_size, average="micro", ignore_index=IGNORE_INDEX
                        ),
                        "ppl": Perplexity(ignore_index=IGNORE_INDEX),
                    },
                    prefix=f"{stage}_",
                )
                for stage in STAGES
            }
        )

    def build_model(self, config: GPTConfig) -> nn.Module:
        return GPT(config)

    @torch.no_grad()
    def examples(self, batch: dict[str, Tensor], n: int) -> list[dict[str, Any]]:
        """Greedy continuations of the first ``n`` sequences of ``batch``.

        The prompt is everything before the first scored target (the question of a task such
        as addition) or, when every position is scored (plain text), the first half. Rows of
        plain text are marked ``"free": True``: a continuation of free text has no single right
        answer, so it is shown but not scored.
        """
        from transformer_lab.generation import generate

        tokens, targets = batch["tokens"][:n], batch["targets"][:n]
        rows = []
        for i in range(tokens.shape[0]):
            scored = (targets[i] != IGNORE_INDEX).nonzero().flatten()
            if scored.numel() == 0:
                continue
            first = int(scored[0])
            prompt_len = first + 1 if first > 0 else max(1, tokens.shape[1] // 2)
            target = [int(t) for t in targets[i][prompt_len - 1 :] if t != IGNORE_INDEX]
            out = generate(
                self.model, tokens[i : i + 1, :prompt_len], len(target), temperature=0
            )  # (1, prompt_len + len(target)), greedy
            rows.append(
                {
                    "input": tokens[i, :prompt_len].tolist(),
                    "prediction": out[0, prompt_len:].tolist(),
                    "target": target,
                    "labels": False,
                    "free": first == 0,
                }
            )
        return rows

    def _shared_step(self, batch: dict[str, Tensor], stage: str) -> Tensor:
        tokens, targets = batch["tokens"], batch["targets"]
        if stage == "train" and "starts_with_bos" not in self.data_info and self.data_info:
            # Whether training sequences begin with BOS (sentences, addition) or are windows
            # of a stream (characters of a play): `generate` must build its prompts the same way.
            bos = self.data_info.get("bos_id")
            self.data_info["starts_with_bos"] = bos is not None and bool(
                (tokens[:, 0] == bos).all()
            )
        logits = self.model(tokens)  # (B, T, V)
        loss = token_cross_entropy(logits, targets, IGNORE_INDEX)
        if stage in STAGES:
            metrics = self._metrics(stage)
            metrics["acc"].update(logits.argmax(dim=-1).reshape(-1), targets.reshape(-1))
            metrics["ppl"].update(logits.float(), targets)
        log_metrics(self, stage, loss, tokens.shape[0], self.stage_metrics(stage))
        return loss
