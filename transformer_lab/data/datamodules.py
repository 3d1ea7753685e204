"""Lightning DataModules for the kit's tasks: synthetic, sentence grammar and Tiny Shakespeare.

A DataModule owns everything about the data of one task: how it is made or downloaded
(``prepare_data``), split (``setup``) and batched (the dataloaders), plus the numbers a model
needs to be built (vocabulary sizes, special ids, lengths). The training layer links those
attributes into the model config, so a YAML file never repeats them.

Every batch is a ``dict`` of tensors in one of the three formats of ``docs/contracts.md``
(``"tagging"``, ``"seq2seq"``, ``"lm"``); see :mod:`transformer_lab.data.synthetic` for the
encoding of the synthetic tasks.

Reference: Lightning's ``LightningDataModule`` guide,
https://lightning.ai/docs/pytorch/stable/data/datamodule.html
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
)

from transformer_lab.data import corpus, grammar
from transformer_lab.data.synthetic import (
    BOS_ID,
    EOS_ID,
    FORMATS,
    IGNORE_INDEX,
    MAX_DIGITS,
    NUM_SPECIAL,
    PAD_ID,
    TASKS,
    draw_disjoint,
    make_split,
    split_generator,
    task_symbols,
)
from transformer_lab.tokenizers import CharTokenizer

__all__ = [
    "BlockDataset",
    "CharCorpusDataModule",
    "CorpusFallbackWarning",
    "GrammarDataModule",
    "SyntheticDataModule",
    "TensorDictDataset",
]


#: The corpora whose fallback warning was already shown in this process (one warning each).
_WARNED: set[tuple[str | None, str, str]] = set()


class CorpusFallbackWarning(UserWarning):
    """The corpus could not be found or downloaded: a synthetic one is used instead."""


class TensorDictDataset(Dataset):
    """A map-style dataset over a dict of tensors sharing their first dimension.

    Item ``i`` is ``{key: tensor[i]}``; PyTorch's default collate stacks items back into a dict
    of ``(B, ...)`` tensors, which is the batch format the kit's LightningModules expect.

    Args:
        tensors: the columns, e.g. ``{"tokens": (N, T), "targets": (N, T)}``.

    Raises:
        ValueError: if the columns have different lengths or the dict is empty.
    """

    def __init__(self, tensors: dict[str, Tensor]) -> None:
        if not tensors:
            raise ValueError("tensors is empty: a dataset needs at least one column")
        lengths = {k: len(v) for k, v in tensors.items()}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"all columns need the same first dimension, got {lengths}")
        self.tensors = tensors
        self._n = next(iter(lengths.values()))

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        return {k: v[index] for k, v in self.tensors.items()}


def pin_memory(trainer: Any = None) -> bool:
    """Whether batches should be pinned: when they go to a CUDA GPU, since a copy to the GPU from
    ordinary (pageable) memory makes the CPU wait for the GPU to finish its queue, on every batch.

    With the ``trainer`` the loader serves, only if it trains on CUDA: a run on the CPU of a GPU
    machine (``lab.CPU_LABS``) would otherwise start CUDA and pin every batch for nothing.
    Without one (a loader built by hand), wherever CUDA is.
    """
    if trainer is not None:
        device = getattr(getattr(trainer, "strategy", None), "root_device", None)
        return device is not None and device.type == "cuda"
    return torch.cuda.is_available()


def _loader(
    dataset: Dataset,
    batch_size: int,
    *,
    shuffle: bool,
    seed: int,
    num_workers: int,
    pin: bool | None = None,
) -> DataLoader:
    # A seeded generator makes the shuffling order reproducible and independent of the global RNG.
    generator = torch.Generator().manual_seed(seed) if shuffle else None
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        generator=generator,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
        pin_memory=pin_memory() if pin is None else pin,
    )


def _check_positive(**values: int) -> None:
    bad = {k: v for k, v in values.items() if v < 1}
    if bad:
        raise ValueError(", ".join(f"{k}={v}" for k, v in bad.items()) + " must be >= 1")


class _InMemoryDataModule(pl.LightningDataModule):
    """Dataloaders over ``self.train_data`` / ``self.val_data`` dicts drawn in ``setup``."""

    batch_size: int
    seed: int
    num_workers: int
    train_data: dict[str, Tensor] | None
    val_data: dict[str, Tensor] | None

    def train_dataloader(self) -> DataLoader:
        """Shuffled training batches (seeded order)."""
        return self._dataloader(train=True)

    def val_dataloader(self) -> DataLoader:
        """Validation batches in a fixed order."""
        return self._dataloader(train=False)

    def test_dataloader(self) -> DataLoader:
        """The validation set (these tasks have no separate test split)."""
        return self.val_dataloader()

    def predict_dataloader(self) -> DataLoader:
        """The validation set, for ``transformer-lab predict``."""
        return self.val_dataloader()

    def _require_setup(self) -> None:
        if self.train_data is None:
            self.setup()

    def _dataloader(self, *, train: bool) -> DataLoader:
        """Batches of the training split (shuffled, seeded) or the validation split (in order)."""
        self._require_setup()
        return _loader(
            TensorDictDataset(self.train_data if train else self.val_data),
            self.batch_size,
            shuffle=train,
            seed=self.seed,
            num_workers=self.num_workers,
            pin=pin_memory(self.trainer),
        )


class SyntheticDataModule(_InMemoryDataModule):
    """Copy, reverse, sort, majority or addition, generated from a seed (no files, no network).

    How to use::

        dm = SyntheticDataModule(task="reverse", seq_len=16, num_symbols=10)
        dm.setup("fit")
        batch = next(iter(dm.train_dataloader()))
        batch["tokens"].shape   # (64, 16); keys: tokens, padding_mask, targets
        dm.vocab_size           # 13 = pad, bos, eos + 10 symbols
        dm.decode(batch["tokens"][0])  # "3071..." (symbols as characters)

    Args:
        task: ``"copy"``, ``"reverse"``, ``"sort"``, ``"majority"`` (one label per sequence, for
            a sequence head) or ``"addition"``.
        seq_len: longest input sequence ``T`` (all tasks but addition).
        num_symbols: alphabet size (all tasks but addition); ids ``3 .. 2 + num_symbols``.
        num_train: training examples (drawn once in ``setup``).
        num_val: validation examples; never equal (as input) to any training example.
        batch_size: examples per batch.
        seed: seeds the train stream, the validation stream and the shuffling; same seed, same
            data and order everywhere.
        format: ``"tagging"`` (encoder; all tasks but addition), ``"seq2seq"`` (all tasks but
            majority) or ``"lm"`` (addition).
        min_len: shortest input for variable-length, padded sequences; None = fixed ``seq_len``.
        num_digits: digits per operand (addition).
        num_workers: DataLoader workers (0 is fastest for in-memory tensors).

    Batches (dicts; see :mod:`transformer_lab.data.synthetic`):
        tagging: ``tokens``, ``padding_mask``, ``targets`` ``(B, T)`` (majority: ``(B,)``);
        seq2seq: ``src``, ``src_padding_mask`` ``(B, S)``, ``tgt_in``, ``tgt_out``,
        ``tgt_padding_mask`` ``(B, T)``; lm: ``tokens``, ``targets`` ``(B, T)``.

    Attributes:
        vocab_size, src_vocab_size, tgt_vocab_size: all equal (one shared vocabulary).
        num_classes: ``vocab_size`` (tagging targets, majority labels too, are token ids).
        pad_id, bos_id, eos_id: 0, 1, 2.
        max_len: longest sequence any batch holds (input or target), for positional tables.
        block_size: the LM sequence length (``lm`` format), else ``max_len``.
        symbols: printable symbol of each symbol id (id ``3 + i`` prints ``symbols[i]``).
        tokenizer: a :class:`~transformer_lab.tokenizers.CharTokenizer` over ``symbols`` with
            specials pad/bos/eos at 0/1/2 (encode a prompt, decode predictions).
        train_data, val_data: the tensor dicts, after ``setup``.
    """

    def __init__(
        self,
        task: str = "reverse",
        seq_len: int = 16,
        num_symbols: int = 10,
        num_train: int = 10_000,
        num_val: int = 1_000,
        batch_size: int = 64,
        seed: int = 0,
        format: str = "tagging",
        min_len: int | None = None,
        num_digits: int = 2,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        if task not in TASKS:
            raise ValueError(f"task={task!r} is not one of {TASKS}")
        if format not in FORMATS:
            raise ValueError(f"format={format!r} is not one of {FORMATS}")
        allowed = {"addition": ("seq2seq", "lm"), "majority": ("tagging",)}.get(
            task, ("tagging", "seq2seq")
        )
        if format not in allowed:
            raise ValueError(
                f"format={format!r} is not available for task={task!r}: use one of {allowed}"
            )
        _check_positive(
            seq_len=seq_len, num_train=num_train, num_val=num_val, batch_size=batch_size
        )
        if min_len is not None and not 1 <= min_len <= seq_len:
            raise ValueError(f"min_len={min_len} must be between 1 and seq_len={seq_len}")
        if task == "addition" and not 1 <= num_digits <= MAX_DIGITS:
            raise ValueError(f"num_digits={num_digits} must be between 1 and {MAX_DIGITS}")
        self.save_hyperparameters()
        self.task = task
        self.format = format
        self.seq_len = seq_len
        self.num_symbols = num_symbols
        self.num_train = num_train
        self.num_val = num_val
        self.batch_size = batch_size
        self.seed = seed
        self.min_len = min_len
        self.num_digits = num_digits
        self.num_workers = num_workers
        self.symbols = task_symbols(task, num_symbols)  # validates num_symbols

        self.pad_id, self.bos_id, self.eos_id = PAD_ID, BOS_ID, EOS_ID
        self.vocab_size = NUM_SPECIAL + len(self.symbols)
        self.src_vocab_size = self.tgt_vocab_size = self.num_classes = self.vocab_size
        if task == "addition":
            lengths = {"seq2seq": (2 * num_digits + 1, num_digits + 2), "lm": (3 * num_digits + 4,)}
            self.max_len = max(lengths[format])
        else:
            self.max_len = seq_len + 1 if format == "seq2seq" else seq_len
        self.block_size = self.max_len
        self.train_data: dict[str, Tensor] | None = None
        self.val_data: dict[str, Tensor] | None = None
        self.tokenizer = CharTokenizer.from_symbols(
            self.symbols, specials=("<pad>", "<bos>", "<eos>")
        )

    def decode(self, ids: Tensor | list[int], *, skip_special: bool = True) -> str:
        """Print ids with one character per symbol.

        Special ids and the ignore index -100 (padding in ``targets``) are dropped by default.
        """
        ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        if skip_special:
            ids = [i for i in ids if i != IGNORE_INDEX]
        return self.tokenizer.decode(ids, skip_special=skip_special)

    def _params(self) -> dict[str, int | None]:
        if self.task == "addition":
            return {"num_digits": self.num_digits}
        return {"seq_len": self.seq_len, "num_symbols": self.num_symbols, "min_len": self.min_len}

    def setup(self, stage: str | None = None) -> None:
        """Draw the training and validation sets (idempotent; cheap: tensors in memory)."""
        if self.train_data is not None:
            return
        params = self._params()
        self.train_data = make_split(
            self.task, self.num_train, seed=self.seed, split="train", format=self.format, **params
        )
        self.val_data = make_split(
            self.task,
            self.num_val,
            seed=self.seed,
            split="val",
            format=self.format,
            exclude=self.train_data,
            **params,
        )


class GrammarDataModule(_InMemoryDataModule):
    """Sentences of a small English grammar: translation to a verb-final language, or an LM.

    See :mod:`transformer_lab.data.grammar` for the grammar and the made-up target language
    ("the big men ate a fish" -> "tori gran li pesk un mangon").

    How to use::

        dm = GrammarDataModule(task="translation")
        dm.setup("fit")
        batch = next(iter(dm.train_dataloader()))   # src (64, 7), tgt_in/tgt_out (64, 8), masks
        dm.tokenizer.decode(batch["src"][0], skip_special=True)      # "the dogs chased the child"
        dm.tokenizer.decode(batch["tgt_out"][0], skip_special=True)  # "huni li kimo la kuron"

        lm = GrammarDataModule(task="lm")        # tokens/targets (64, 8): BOS sentence EOS

    Args:
        task: ``"translation"`` (seq2seq format) or ``"lm"`` (lm format, English only).
        num_train: training sentences.
        num_val: validation sentences, none of which occurs in the training set.
        batch_size: sentences per batch.
        seed: seeds the train and validation streams and the shuffling.
        adjective_prob, plural_prob, indefinite_prob, present_prob: see
            :class:`~transformer_lab.data.grammar.GrammarConfig`.
        num_workers: DataLoader workers.

    Attributes:
        tokenizer: a :class:`~transformer_lab.tokenizers.WordTokenizer`; for translation one
            vocabulary holds the words of both languages (disjoint lists), so it decodes source,
            prediction and target alike; for ``lm`` it holds the English words.
        src_tokenizer, tgt_tokenizer: the same object as ``tokenizer``.
        src_vocab_size, tgt_vocab_size, vocab_size: all ``tokenizer.vocab_size``.
        pad_id, bos_id, eos_id: 0, 1, 2 (``<unk>`` is 3 and never occurs).
        max_len, block_size: 8, the longest sequence in any batch.
        train_data, val_data: the tensor dicts, after ``setup``.
    """

    TASKS: tuple[str, ...] = ("translation", "lm")

    def __init__(
        self,
        task: str = "translation",
        num_train: int = 5_000,
        num_val: int = 500,
        batch_size: int = 64,
        seed: int = 0,
        adjective_prob: float = 0.5,
        plural_prob: float = 0.3,
        indefinite_prob: float = 0.3,
        present_prob: float = 0.5,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        if task not in self.TASKS:
            raise ValueError(f"task={task!r} is not one of {self.TASKS}")
        _check_positive(num_train=num_train, num_val=num_val, batch_size=batch_size)
        self.save_hyperparameters()
        self.task = task
        self.num_train, self.num_val = num_train, num_val
        self.batch_size, self.seed, self.num_workers = batch_size, seed, num_workers
        self.config = grammar.GrammarConfig(
            adjective_prob=adjective_prob,
            plural_prob=plural_prob,
            indefinite_prob=indefinite_prob,
            present_prob=present_prob,
        )
        # Translation shares one vocabulary across both languages, so ``tokenizer`` decodes
        # source and target ids alike (the word lists are disjoint).
        self.tokenizer = (
            grammar.shared_tokenizer() if task == "translation" else grammar.english_tokenizer()
        )
        self.src_tokenizer = self.tgt_tokenizer = self.tokenizer
        self.src_vocab_size = self.src_tokenizer.vocab_size
        self.tgt_vocab_size = self.tgt_tokenizer.vocab_size
        self.vocab_size = self.tgt_vocab_size
        self.pad_id, self.bos_id, self.eos_id = PAD_ID, BOS_ID, EOS_ID
        self.max_len = self.block_size = grammar.MAX_SENTENCE_WORDS + 1
        self.train_data = None
        self.val_data = None

    def draw(self, split: str) -> Callable[[int], dict[str, Tensor]]:
        """``draw(k)``: ``k`` more sentences of this grammar and these tokenizers, from the
        stream of ``split`` (``"train"``, ``"val"``, or any other name: a stream of its own)."""
        generator = split_generator(self.seed, f"grammar-{self.task}-{split}")
        if self.task == "translation":
            return lambda k: grammar.make_grammar_translation(
                k,
                generator=generator,
                config=self.config,
                src_tokenizer=self.src_tokenizer,
                tgt_tokenizer=self.tgt_tokenizer,
            )
        return lambda k: grammar.make_grammar_lm(
            k, generator=generator, config=self.config, tokenizer=self.src_tokenizer
        )

    def setup(self, stage: str | None = None) -> None:
        """Draw the training and validation sentences (idempotent)."""
        if self.train_data is not None:
            return
        self.train_data = self.draw("train")(self.num_train)
        self.val_data = draw_disjoint(
            self.draw("val"),
            self.num_val,
            exclude=self.train_data,
            what=f"validation sentences (task={self.task!r})",
            key=lambda d: d["src"] if "src" in d else d["tokens"],
        )


class BlockDataset(Dataset):
    """Windows of a long id sequence: item ``i`` starts at ``offsets[i]``.

    Args:
        data: the corpus as ids ``(N,)``.
        block_size: window length ``T``.
        offsets: start of each window ``(M,)``; every ``offset + T + 1 <= N``.

    Items are ``{"tokens": data[o : o + T], "targets": data[o + 1 : o + T + 1]}``. A list of
    indices gives the whole batch at once (``(B, T)`` tensors), gathered in one indexing
    operation: :meth:`loader` uses that, so a batch costs no per-window Python work and no
    collation (0.4 instead of 0.7 ms for 64 windows of 256 characters on one CPU thread; on a
    GPU the difference is several percent of a small model's step).
    """

    def __init__(self, data: Tensor, block_size: int, offsets: Tensor) -> None:
        if len(offsets) and int(offsets.max()) + block_size + 1 > len(data):
            raise ValueError(
                f"a window at offset {int(offsets.max())} with block_size={block_size} runs past "
                f"the end of the data (length {len(data)})"
            )
        self.data, self.block_size, self.offsets = data, block_size, offsets
        self._span = torch.arange(block_size + 1)  # (T + 1,)

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, index: int | list[int]) -> dict[str, Tensor]:
        if isinstance(index, int):
            start = int(self.offsets[index])
            window = self.data[start : start + self.block_size + 1]  # (T + 1,)
            return {"tokens": window[:-1], "targets": window[1:]}
        starts = self.offsets[torch.as_tensor(index, dtype=torch.long)]  # (B,)
        windows = self.data[starts[:, None] + self._span]  # (B, T + 1)
        return {"tokens": windows[:, :-1], "targets": windows[:, 1:]}

    def loader(
        self, sampler: Sampler[int], batch_size: int, num_workers: int, pin: bool | None = None
    ) -> DataLoader:
        """Batches of the windows ``sampler`` picks, ``batch_size`` at a time (the last may be
        smaller), each fetched as one gathered batch; ``pin``: :func:`pin_memory` by default."""
        return DataLoader(
            self,
            batch_size=None,  # the batch sampler's index lists arrive whole at __getitem__
            sampler=BatchSampler(sampler, batch_size, drop_last=False),
            num_workers=num_workers,
            persistent_workers=num_workers > 0,
            pin_memory=pin_memory() if pin is None else pin,
        )


class CharCorpusDataModule(pl.LightningDataModule):
    """A character-level language-modelling corpus: Tiny Shakespeare by default.

    How to use::

        dm = CharCorpusDataModule()            # downloads once into the cache (prepare_data)
        dm = CharCorpusDataModule(path="data/tinyshakespeare.txt")  # a local file
        dm = CharCorpusDataModule(fallback="grammar")  # offline: synthetic sentences instead
        dm.prepare_data(); dm.setup("fit")
        batch = next(iter(dm.train_dataloader()))      # tokens, targets: (12, 64) int64
        dm.tokenizer.decode(batch["tokens"][0])        # 64 characters of a play

    The text is split by characters: the first ``1 - val_fraction`` of it trains, the rest
    validates (no window crosses the boundary). Training windows start at random offsets (a
    seeded permutation of all offsets, a fresh one each epoch); validation windows are fixed,
    non-overlapping, in order.

    Args:
        path: a local text file, used as is (no download). A checksum that differs from
            ``sha256`` only warns.
        url: where ``prepare_data`` downloads the corpus when ``path`` is None.
        sha256: expected digest of the download (None: no check).
        cache_dir: download cache (default ``$TRANSFORMER_LAB_CACHE`` or
            ``~/.cache/transformer_lab``).
        block_size: characters per window ``T`` (the model's context length).
        batch_size: windows per batch.
        val_fraction: share of the characters kept for validation (the end of the text).
        seed: seeds the training offsets.
        train_samples: training windows per epoch (default: one pass worth of characters,
            ``len(train) // block_size``).
        val_blocks: cap on validation windows (default: all of them).
        fallback: ``"grammar"`` to train on sentences of :mod:`transformer_lab.data.grammar`
            when the corpus can be neither found nor downloaded (a
            :class:`CorpusFallbackWarning` says so, once per corpus and process); None to
            raise a :class:`~transformer_lab.data.corpus.CorpusUnavailableError`.
        advice: what that warning tells the reader to do for the real corpus, in place of the
            library's generic fixes (``pass path=...``): a notebook names its own editable
            setting, e.g. ``"set CORPUS_PATH = '...' in the settings cell above"``.
        timeout: seconds to wait for the download server.
        num_workers: DataLoader workers.

    Attributes:
        tokenizer: a :class:`~transformer_lab.tokenizers.CharTokenizer`. For the default corpus
            its alphabet is the 65 known characters of Tiny Shakespeare (ids 4..68 after pad, bos,
            eos, unk), so it exists before any download; for ``path=`` it is fitted on the file.
        vocab_size: ``tokenizer.vocab_size`` (69 for Tiny Shakespeare).
        pad_id, bos_id, eos_id: 0, 1, 2 (unused by the windows, kept for the shared contract).
        block_size, max_len: ``T``.
        source: after ``setup``: the file read, or ``"fallback:grammar"``.
        train_ids, val_ids: the two parts of the corpus as ids ``(N,)``, after ``setup``.
    """

    FALLBACKS: tuple[str, ...] = ("grammar",)

    def __init__(
        self,
        path: str | None = None,
        url: str = corpus.DEFAULT_URL,
        sha256: str | None = corpus.TINY_SHAKESPEARE_SHA256,
        cache_dir: str | None = None,
        block_size: int = 64,
        batch_size: int = 12,
        val_fraction: float = 0.1,
        seed: int = 0,
        train_samples: int | None = None,
        val_blocks: int | None = None,
        fallback: str | None = None,
        timeout: float = 30.0,
        num_workers: int = 0,
        advice: str | None = None,
    ) -> None:
        super().__init__()
        _check_positive(block_size=block_size, batch_size=batch_size)
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction={val_fraction} must be strictly between 0 and 1")
        if fallback is not None and fallback not in self.FALLBACKS:
            raise ValueError(f"fallback={fallback!r} is not None or one of {self.FALLBACKS}")
        for name, value in (("train_samples", train_samples), ("val_blocks", val_blocks)):
            if value is not None and value < 1:
                raise ValueError(f"{name}={value} must be >= 1 (or None)")
        self.save_hyperparameters()
        self.path, self.url, self.sha256, self.cache_dir = path, url, sha256, cache_dir
        self.block_size = self.max_len = block_size
        self.batch_size, self.val_fraction, self.seed = batch_size, val_fraction, seed
        self.train_samples, self.val_blocks = train_samples, val_blocks
        self.fallback, self.timeout, self.num_workers = fallback, timeout, num_workers
        self.advice = advice
        self._unavailable = False  # set when prepare_data fell back: no second download try
        self.pad_id, self.bos_id, self.eos_id = PAD_ID, BOS_ID, EOS_ID
        self.source: str | None = None
        self.train_ids: Tensor | None = None
        self.val_ids: Tensor | None = None
        self._tokenizer: CharTokenizer | None = None

    # -- vocabulary ---------------------------------------------------------------------------

    @property
    def tokenizer(self) -> CharTokenizer:
        """The character tokenizer (reads ``path`` if one was given; never downloads)."""
        if self._tokenizer is None:
            if self.path is None:
                self._tokenizer = CharTokenizer.from_symbols(
                    corpus.TINY_SHAKESPEARE_CHARS, unk="<unk>"
                )
            else:
                # The same vocabulary as CharTokenizer().fit(text), built without lab 07's
                # answer (fit), which the student package keeps locked until its deadline.
                text = self._read(Path(self.path))
                self._tokenizer = CharTokenizer.from_symbols(sorted(set(text)), unk="<unk>")
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        """Number of ids the model must handle."""
        return self.tokenizer.vocab_size

    # -- data ---------------------------------------------------------------------------------

    def _cached_path(self) -> Path:
        root = Path(self.cache_dir).expanduser() if self.cache_dir else corpus.default_cache_dir()
        return root / corpus.TINY_SHAKESPEARE_FILENAME

    @staticmethod
    def _read(path: Path) -> str:
        return path.read_text(encoding="utf-8")

    def prepare_data(self) -> None:
        """Make sure the corpus is on disk: check ``path``, or download into the cache.

        Raises:
            ChecksumError: a download had the wrong checksum (nothing was cached).
            CorpusUnavailableError: offline without a cached copy and without ``fallback``.
        """
        if self._unavailable:
            return  # a notebook's call, then the Trainer's: one download try, one warning
        try:
            corpus.fetch_corpus(
                self.path,
                url=self.url,
                sha256=self.sha256,
                cache_dir=self.cache_dir,
                timeout=self.timeout,
            )
        except corpus.ChecksumError:
            raise
        except corpus.CorpusUnavailableError as err:
            if self.fallback is None:
                raise
            self._unavailable = True
            which = (self.path, self.url, str(self._cached_path()))
            if which in _WARNED:
                return  # another module of the same corpus: its warning was shown
            _WARNED.add(which)
            if self.advice:
                text = (
                    f"{err.reason}\nTraining on the synthetic {self.fallback!r} corpus instead. "
                    f"For the real one: {self.advice}"
                )
            else:
                text = f"{err}\nFalling back to the synthetic {self.fallback!r} corpus."
            # Attributed to this line (stacklevel=1): the caller is Lightning's own code.
            warnings.warn(text, CorpusFallbackWarning, stacklevel=1)

    def _load_text(self) -> tuple[str, str]:
        if self.path is not None:
            path = Path(self.path).expanduser()
            if not path.is_file():
                raise FileNotFoundError(f"path={self.path!r} does not exist or is not a file")
            return self._read(path), str(path)
        cached = self._cached_path()
        if cached.is_file():
            return self._read(cached), str(cached)
        if self.fallback == "grammar":
            # About 1 MB of sentences, like the real corpus; the same for every seed of the run.
            return grammar.grammar_text(30_000, seed=self.seed), "fallback:grammar"
        raise corpus.CorpusUnavailableError(
            f"no corpus at {cached}: call prepare_data() first (it downloads the file), or "
            "pass path='/path/to/tinyshakespeare.txt', or use fallback='grammar'"
        )

    def setup(self, stage: str | None = None) -> None:
        """Read, encode and split the corpus (idempotent; never downloads)."""
        if self.train_ids is not None:
            return
        text, self.source = self._load_text()
        ids = torch.tensor(self.tokenizer.encode(text), dtype=torch.long)  # (N,)
        n_train = int(len(ids) * (1.0 - self.val_fraction))
        train, val = ids[:n_train], ids[n_train:]
        shortest = min(len(train), len(val))
        if shortest < self.block_size + 1:
            raise ValueError(
                f"block_size={self.block_size} needs at least {self.block_size + 1} characters in "
                f"each split, but the {len(ids)}-character corpus with val_fraction="
                f"{self.val_fraction} leaves {len(train)} for training and {len(val)} for "
                "validation"
            )
        self.train_ids, self.val_ids = train, val

    def train_dataloader(self) -> DataLoader:
        """Windows at random offsets: a seeded permutation, different each epoch."""
        self._require_setup()
        assert self.train_ids is not None
        offsets = torch.arange(len(self.train_ids) - self.block_size)  # every valid start
        num_samples = self.train_samples or max(1, len(self.train_ids) // self.block_size)
        dataset = BlockDataset(self.train_ids, self.block_size, offsets)
        sampler = RandomSampler(
            dataset,
            replacement=num_samples > len(offsets),
            num_samples=num_samples,
            generator=torch.Generator().manual_seed(self.seed),
        )
        return dataset.loader(sampler, self.batch_size, self.num_workers, pin_memory(self.trainer))

    def val_dataloader(self) -> DataLoader:
        """Fixed, non-overlapping windows of the validation text, in order."""
        self._require_setup()
        assert self.val_ids is not None
        offsets = torch.arange(0, len(self.val_ids) - self.block_size, self.block_size)
        if self.val_blocks is not None:
            offsets = offsets[: self.val_blocks]
        dataset = BlockDataset(self.val_ids, self.block_size, offsets)
        pin = pin_memory(self.trainer)
        return dataset.loader(SequentialSampler(dataset), self.batch_size, self.num_workers, pin)

    def test_dataloader(self) -> DataLoader:
        """The validation windows."""
        return self.val_dataloader()

    def _require_setup(self) -> None:
        if self.train_ids is None:
            self.setup()
