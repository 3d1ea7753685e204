"""Data for the kit: seeded synthetic tasks, a sentence grammar, Tiny Shakespeare, DataModules.

What lives here:

* :mod:`.synthetic`: copy, reverse, sort and addition drawn from a seeded ``torch.Generator``
  (special ids pad=0, bos=1, eos=2, then symbols).
* :mod:`.grammar`: a small English grammar ("the man ate the fish") for word-order translation
  into a made-up verb-final language and for language modelling with agreement.
* :mod:`.corpus`: the Tiny Shakespeare download (in ``prepare_data`` only), checksum and cache.
* :mod:`.datamodules`: ``SyntheticDataModule``, ``GrammarDataModule``, ``CharCorpusDataModule``.

Names are imported lazily (PEP 562), so ``from transformer_lab.data import make_task`` does not
pay for importing Lightning.

Reference: the batch formats are those of ``docs/contracts.md``; Lightning's DataModule guide,
https://lightning.ai/docs/pytorch/stable/data/datamodule.html
"""

from __future__ import annotations

from transformer_lab._lazy import lazy_exports

_EXPORTS = {
    "BOS_ID": "synthetic",
    "EOS_ID": "synthetic",
    "IGNORE_INDEX": "synthetic",
    "PAD_ID": "synthetic",
    "TASKS": "synthetic",
    "make_addition": "synthetic",
    "make_sequence_task": "synthetic",
    "make_split": "synthetic",
    "make_task": "synthetic",
    "split_generator": "synthetic",
    "TensorDictDataset": "datamodules",
    "SyntheticDataModule": "datamodules",
    "GrammarDataModule": "datamodules",
    "CharCorpusDataModule": "datamodules",
    "CorpusFallbackWarning": "datamodules",
    "BlockDataset": "datamodules",
    "fetch_corpus": "corpus",
    "download_file": "corpus",
    "default_cache_dir": "corpus",
    "sha256_file": "corpus",
    "ChecksumError": "corpus",
    "CorpusUnavailableError": "corpus",
    "DownloadError": "corpus",
    "DEFAULT_URL": "corpus",
    "TINY_SHAKESPEARE_SHA256": "corpus",
    "GrammarConfig": "grammar",
    "agreement_probes": "grammar",
    "grammar_text": "grammar",
    "sample_sentences": "grammar",
    "make_grammar_lm": "grammar",
    "make_grammar_translation": "grammar",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
