"""Tiny Shakespeare: local path, download through a loopback HTTP server, cache, errors, batches."""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import LoopbackServer as _Server

from transformer_lab.data import (
    TINY_SHAKESPEARE_SHA256,
    BlockDataset,
    CharCorpusDataModule,
    ChecksumError,
    CorpusUnavailableError,
    download_file,
    fetch_corpus,
)
from transformer_lab.data.corpus import TINY_SHAKESPEARE_CHARS, default_cache_dir


@pytest.fixture
def shakespeare_bytes(tiny_shakespeare_path: Path) -> bytes:
    return tiny_shakespeare_path.read_bytes()


@pytest.fixture
def good_server(shakespeare_bytes: bytes) -> Iterator[_Server]:
    with _Server(shakespeare_bytes) as server:
        yield server


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/tinyshakespeare.txt"  # nothing listens there any more


# ----------------------------------------------------------------------------- download


def test_download_is_cached_verified_and_not_repeated(good_server: _Server, tmp_path: Path) -> None:
    dm = CharCorpusDataModule(url=good_server.url, cache_dir=str(tmp_path))
    dm.prepare_data()
    cached = tmp_path / "tinyshakespeare.txt"
    assert cached.read_bytes() == good_server.payload
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == TINY_SHAKESPEARE_SHA256
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tinyshakespeare.txt"]  # no temp left
    assert good_server.requests == 1
    dm.prepare_data()
    CharCorpusDataModule(url=good_server.url, cache_dir=str(tmp_path)).prepare_data()
    assert good_server.requests == 1  # the cached copy is reused
    dm.setup()
    assert dm.source == str(cached)


def test_corrupt_download_leaves_nothing(shakespeare_bytes: bytes, tmp_path: Path) -> None:
    corrupt = shakespeare_bytes[:-100]  # a truncated transfer
    actual = hashlib.sha256(corrupt).hexdigest()
    with _Server(corrupt) as server:
        dm = CharCorpusDataModule(url=server.url, cache_dir=str(tmp_path))
        with pytest.raises(ChecksumError) as info:
            dm.prepare_data()
    message = str(info.value)
    assert TINY_SHAKESPEARE_SHA256 in message and actual in message
    assert list(tmp_path.iterdir()) == []


def test_corrupt_cached_copy_is_replaced(good_server: _Server, tmp_path: Path) -> None:
    (tmp_path / "tinyshakespeare.txt").write_text("not shakespeare")
    with pytest.warns(UserWarning, match="fails its checksum"):
        path = fetch_corpus(url=good_server.url, cache_dir=tmp_path)
    assert path.read_bytes() == good_server.payload


def test_no_server_gives_an_actionable_error(tmp_path: Path) -> None:
    dm = CharCorpusDataModule(url=_closed_port_url(), cache_dir=str(tmp_path), timeout=5)
    with pytest.raises(CorpusUnavailableError) as info:
        dm.prepare_data()
    message = str(info.value)
    assert "path=" in message and "fallback='grammar'" in message and "GrammarDataModule" in message
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(CorpusUnavailableError, match="prepare_data"):
        dm.setup()


def test_offline_fallback_to_grammar(tmp_path: Path) -> None:
    dm = CharCorpusDataModule(
        url=_closed_port_url(), cache_dir=str(tmp_path), fallback="grammar", timeout=5
    )
    with pytest.warns(UserWarning, match="Falling back"):
        dm.prepare_data()
    dm.setup()
    assert dm.source == "fallback:grammar"
    batch = next(iter(dm.val_dataloader()))
    assert batch["tokens"].shape == (12, 64)
    assert dm.tokenizer.unk_id not in batch["tokens"]  # the grammar's characters are all known


def test_download_file_refuses_bad_checksum_directly(good_server: _Server, tmp_path: Path) -> None:
    dest = tmp_path / "sub" / "x.txt"
    with pytest.raises(ChecksumError, match=r"expected sha256 0{64}, got"):
        download_file(good_server.url, dest, sha256="0" * 64)
    assert not dest.exists() and list(dest.parent.iterdir()) == []
    assert download_file(good_server.url, dest, sha256=None).stat().st_size > 0


def test_cache_dir_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRANSFORMER_LAB_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("TRANSFORMER_LAB_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "transformer_lab"


def test_nothing_is_downloaded_before_prepare_data(tmp_path: Path) -> None:
    dm = CharCorpusDataModule(url=_closed_port_url(), cache_dir=str(tmp_path))
    assert dm.vocab_size == 4 + 65  # known without the file
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- local file


def test_local_path_split_and_batches(tiny_shakespeare_path: Path) -> None:
    dm = CharCorpusDataModule(path=str(tiny_shakespeare_path), block_size=32, batch_size=4)
    dm.prepare_data()
    dm.setup("fit")
    text = tiny_shakespeare_path.read_text("utf-8")
    assert dm.tokenizer.vocab == sorted(set(text)) == list(TINY_SHAKESPEARE_CHARS)
    assert dm.vocab_size == 69
    n_train = int(len(text) * 0.9)
    assert len(dm.train_ids) == n_train and len(dm.val_ids) == len(text) - n_train
    assert dm.tokenizer.decode(dm.train_ids[:200]) == text[:200]
    assert dm.tokenizer.decode(dm.val_ids[:200]) == text[n_train : n_train + 200]

    batch = next(iter(dm.train_dataloader()))
    assert batch["tokens"].shape == batch["targets"].shape == (4, 32)
    assert batch["tokens"].dtype == torch.int64
    torch.testing.assert_close(batch["tokens"][:, 1:], batch["targets"][:, :-1])
    for row in batch["tokens"]:  # every training window lies in the first 90%
        assert dm.tokenizer.decode(row) in text[: n_train + 1]


def test_block_dataset_gathers_a_batch_like_its_single_windows() -> None:
    data = torch.arange(100)
    dataset = BlockDataset(data, block_size=5, offsets=torch.tensor([0, 7, 30, 94]))
    batch = dataset[[3, 0, 2]]
    singles = [dataset[i] for i in (3, 0, 2)]
    for key in ("tokens", "targets"):
        torch.testing.assert_close(batch[key], torch.stack([item[key] for item in singles]))
    torch.testing.assert_close(batch["tokens"][0], torch.arange(94, 99))
    loader = dataset.loader(torch.utils.data.SequentialSampler(dataset), 3, num_workers=0)
    shapes = [tuple(b["tokens"].shape) for b in loader]
    assert shapes == [(3, 5), (1, 5)] and len(loader) == 2  # the last batch may be smaller
    with pytest.raises(ValueError, match="offset 96 with block_size=5"):
        BlockDataset(data, block_size=5, offsets=torch.tensor([96]))


def test_train_offsets_seeded_and_val_fixed(tiny_shakespeare_path: Path) -> None:
    def loaders(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        dm = CharCorpusDataModule(path=str(tiny_shakespeare_path), seed=seed, train_samples=24)
        dm.setup()
        train = dm.train_dataloader()
        first_epoch = next(iter(train))["tokens"]
        second_epoch = next(iter(train))["tokens"]
        return first_epoch, second_epoch, next(iter(dm.val_dataloader()))["tokens"]

    a1, a2, val_a = loaders(0)
    b1, b2, val_b = loaders(0)
    c1, _, val_c = loaders(1)
    assert torch.equal(a1, b1) and torch.equal(a2, b2)  # same seed, same windows
    assert not torch.equal(a1, a2)  # a new permutation each epoch
    assert not torch.equal(a1, c1)  # another seed, other windows
    assert torch.equal(val_a, val_b) and torch.equal(val_a, val_c)
    # Validation windows are consecutive, non-overlapping blocks from the start of the val part.
    dm = CharCorpusDataModule(path=str(tiny_shakespeare_path), val_blocks=5, batch_size=5)
    dm.setup()
    val = next(iter(dm.val_dataloader()))["tokens"]
    torch.testing.assert_close(val.flatten(), dm.val_ids[: 5 * 64])
    assert len(dm.val_dataloader()) == 1


def test_user_file_with_other_checksum_warns(tmp_path: Path) -> None:
    own = tmp_path / "own.txt"
    own.write_text("to be or not to be, that is the question\n" * 20)
    with pytest.warns(UserWarning, match="using it anyway"):
        CharCorpusDataModule(path=str(own), block_size=8).prepare_data()
    dm = CharCorpusDataModule(path=str(own), sha256=None, block_size=8, batch_size=2)
    dm.prepare_data()
    dm.setup()
    assert dm.vocab_size == 4 + len(set(own.read_text()))
    assert next(iter(dm.train_dataloader()))["tokens"].shape == (2, 8)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"val_fraction": 1.0}, "val_fraction=1.0"),
        ({"block_size": 0}, "block_size=0"),
        ({"fallback": "poetry"}, "fallback='poetry'"),
        ({"train_samples": 0}, "train_samples=0"),
        ({"path": "/nonexistent/x.txt"}, r"/nonexistent/x\.txt"),
    ],
)
def test_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        CharCorpusDataModule(**kwargs).prepare_data()


def test_block_size_too_large_for_file(tmp_path: Path) -> None:
    small = tmp_path / "small.txt"
    small.write_text("abcdefghij" * 5)
    dm = CharCorpusDataModule(path=str(small), sha256=None, block_size=10)
    with pytest.raises(ValueError, match="block_size=10"):
        dm.setup()


def test_fallback_warns_once_tries_once_and_gives_the_callers_advice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A notebook calls prepare_data, then the Trainer does: one download try, one warning, and
    the advice the caller gave (a notebook's own setting) instead of ``pass path=...``."""
    import warnings

    from transformer_lab.data import CorpusFallbackWarning, corpus, datamodules

    tries = []
    real = corpus.fetch_corpus

    def counting(*args: object, **kwargs: object) -> Path:
        tries.append(kwargs["url"])
        return real(*args, **kwargs)

    monkeypatch.setattr(datamodules.corpus, "fetch_corpus", counting)
    options = dict(url=_closed_port_url(), cache_dir=str(tmp_path), fallback="grammar", timeout=5)
    advice = "set CORPUS_PATH = '/path/to/tinyshakespeare.txt' in the settings cell above."
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dm = CharCorpusDataModule(**options, advice=advice)
        dm.prepare_data()
        dm.prepare_data()  # the Trainer's call: no second try
        CharCorpusDataModule(**options, advice=advice).prepare_data()  # the same corpus again
    fallbacks = [w for w in caught if issubclass(w.category, CorpusFallbackWarning)]
    assert len(fallbacks) == 1 and len(tries) == 2, (fallbacks, tries)
    message = str(fallbacks[0].message)
    assert "could not download" in message and message.endswith(advice)
    assert "pass path=" not in message
    dm.setup()
    assert dm.source == "fallback:grammar"


def test_a_notebook_shows_the_offline_corpus_warning_as_its_text_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In a lab (``lab.setup``), lab 08's offline warning is ``Warning: <text>``: no
    site-packages path, no ``warnings.warn(...)`` source line; other warnings keep Python's."""
    import warnings

    from transformer_lab import lab
    from transformer_lab.data import CorpusFallbackWarning

    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)  # put back after
    lab._plain_kit_warnings()
    lab._plain_kit_warnings()  # a second lab's setup in the same kernel: still one wrapper
    site = "/usr/lib/python3/site-packages/transformer_lab/data/datamodules.py"
    shown = warnings.formatwarning(  # what warnings.showwarning writes to stderr
        CorpusFallbackWarning("could not download it\nTraining on the synthetic corpus."),
        CorpusFallbackWarning, site, 626, "warnings.warn(text, CorpusFallbackWarning)",
    )  # fmt: skip
    assert shown == "Warning: could not download it\nTraining on the synthetic corpus.\n"
    other = warnings.formatwarning("careful", UserWarning, "/x/y.py", 3, "warn('careful')")
    assert other.startswith("/x/y.py:3: UserWarning: careful")
