"""A tiny GPT-2 checkpoint, and a loopback HTTP server that serves it as the Hugging Face hub.

``huggingface_hub.hf_hub_download`` asks ``HEAD {endpoint}/{repo}/resolve/{revision}/{file}``
for the file's commit (``X-Repo-Commit``), ``ETag`` and size, then ``GET``\\ s it (with a
``Range`` header when it resumes a partial download). :class:`LoopbackHub` answers exactly
that on 127.0.0.1 for the files of one folder, under any repository name, counts the
downloads and keeps the ranges asked for; nothing reaches the internet.

:func:`save_tiny_gpt2` writes what a hub repository of GPT-2 holds -- ``config.json``,
``model.safetensors`` (by ``GPT2LMHeadModel.save_pretrained``) and a byte-level BPE
``tokenizer.json`` trained with ``tokenizers`` -- at a size that loads in milliseconds.
"""

from __future__ import annotations

import hashlib
import http.server
import threading
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"
TOKENIZER_TEXT = (
    "The man ate the fish. The fish was eaten by the man. The animal didn't cross the street "
    "because it was too tired. First Citizen: Before we proceed any further, hear me speak. "
) * 20


def save_tiny_tokenizer(path: Path, vocab_size: int = 300) -> Path:
    """A byte-level BPE like GPT-2's (256 bytes, merges, ``<|endoftext|>``) as ``path``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([TOKENIZER_TEXT], trainer)
    tokenizer.save(str(path))
    return path


def save_tiny_gpt2(folder: Path, seed: int = 0) -> Path:
    """A random 2-layer GPT-2 (width 32, 4 heads) and its tokenizer, saved in ``folder``."""
    import torch
    from tokenizers import Tokenizer
    from transformers import GPT2Config, GPT2LMHeadModel

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer.from_file(str(save_tiny_tokenizer(folder / "tokenizer.json")))
    vocab, eos = tokenizer.get_vocab_size(), tokenizer.token_to_id("<|endoftext|>")
    torch.manual_seed(seed)
    config = GPT2Config(
        n_layer=2, n_embd=32, n_head=4, n_positions=64, vocab_size=vocab, bos_token_id=eos,
        eos_token_id=eos,
    )  # fmt: skip
    GPT2LMHeadModel(config).save_pretrained(folder, safe_serialization=True)
    return folder


class LoopbackHub:
    """Serves the files of ``folder`` as every hub repository, on 127.0.0.1; counts GETs.

    Use as a context manager; ``endpoint`` is the value for ``HF_ENDPOINT``. With ``cut``, the
    first download of that file stops halfway (the connection closes), as a dropped connection
    would.
    """

    def __init__(self, folder: Path, cut: str | None = None) -> None:
        self.folder = folder
        self.cut = cut
        self.downloads: list[str] = []
        self.ranges: list[str] = []  # the Range headers of resumed downloads
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _file(self) -> Path | None:
                parts = self.path.split("?")[0].strip("/").split("/")
                if len(parts) < 5 or parts[2] != "resolve":  # owner/name/resolve/rev/file
                    return None
                path = outer.folder / "/".join(parts[4:])
                return path if path.is_file() else None

            def _head(self, path: Path | None, length: int | None = None) -> bytes:
                if path is None:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return b""
                data = path.read_bytes()
                start = 0
                ranged = self.headers.get("Range", "")
                if ranged.startswith("bytes="):
                    outer.ranges.append(ranged)
                    start = int(ranged[6:].split("-")[0] or 0)
                self.send_response(206 if start else 200)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("Content-Length", str(len(data) - start))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                return data[start:]

            def do_HEAD(self) -> None:
                self._head(self._file())

            def do_GET(self) -> None:
                path = self._file()
                body = self._head(path)
                if path is not None:
                    outer.downloads.append(path.name)
                if path is not None and path.name == outer.cut:
                    outer.cut = None  # once
                    body = body[: len(body) // 2]
                    self.close_connection = True
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:  # keep pytest output clean
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> LoopbackHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def closed_port() -> str:
    """An endpoint on 127.0.0.1 where nothing listens (connections are refused at once)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"
