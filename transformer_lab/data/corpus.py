"""Tiny Shakespeare: download on demand, verify by checksum, cache atomically.

The character-level language model of the last lab trains on Tiny Shakespeare (about 1.1 million
characters of the plays, 65 distinct characters). The file is fetched the first time it is needed
and kept in a cache folder; every later run reads the cached copy.

Rules this module keeps:

* Nothing happens at import. Downloads happen only when :func:`fetch_corpus` is called, which the
  DataModule does in ``prepare_data()`` (Lightning runs that once per machine).
* A download goes to a temporary file in the cache folder, is checked against its sha256, and only
  then renamed into place with ``os.replace`` (atomic on one file system). An interrupted or
  corrupt download therefore never leaves a file that looks valid; a checksum mismatch raises
  :class:`ChecksumError` naming the expected and the actual digest.
* A file the user passes explicitly (``path=``) is used as is. If its checksum differs from the
  expected one we *warn* rather than fail: the user may well want to train on their own text
  (pass ``sha256=None`` to silence the warning).
* Offline with no cached copy, :class:`CorpusUnavailableError` says how to fix it: pass ``path=``,
  copy the file into the cache folder, or train on the synthetic corpus.

The cache folder is ``$TRANSFORMER_LAB_CACHE`` if set, else ``~/.cache/transformer_lab``.

Reference: the dataset is Karpathy's ``char-rnn`` Tiny Shakespeare,
https://github.com/karpathy/char-rnn (data/tinyshakespeare/input.txt).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.error
import urllib.request
import warnings
from pathlib import Path

__all__ = [
    "CACHE_ENV",
    "DEFAULT_URL",
    "TINY_SHAKESPEARE_CHARS",
    "TINY_SHAKESPEARE_FILENAME",
    "TINY_SHAKESPEARE_SHA256",
    "ChecksumError",
    "CorpusUnavailableError",
    "DownloadError",
    "default_cache_dir",
    "download_file",
    "fetch_corpus",
    "sha256_file",
]

DEFAULT_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
TINY_SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
TINY_SHAKESPEARE_FILENAME = "tinyshakespeare.txt"
# The 65 characters of the verified file, sorted: the vocabulary is known before any download.
TINY_SHAKESPEARE_CHARS = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
CACHE_ENV = "TRANSFORMER_LAB_CACHE"
_CHUNK = 1 << 16


class CorpusUnavailableError(RuntimeError):
    """The corpus can be neither found locally nor downloaded.

    Attributes:
        reason: what went wrong, without the generic advice the message ends with (a caller
            that knows a better fix, such as a notebook's own setting, gives that instead).
    """

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason or message


class DownloadError(CorpusUnavailableError):
    """The download itself failed (no network, server error, timeout)."""


class ChecksumError(CorpusUnavailableError):
    """The downloaded bytes do not have the expected sha256."""


def default_cache_dir() -> Path:
    """``$TRANSFORMER_LAB_CACHE`` if set and non-empty, else ``~/.cache/transformer_lab``."""
    env = os.environ.get(CACHE_ENV, "").strip()
    return Path(env).expanduser() if env else Path.home() / ".cache" / "transformer_lab"


def sha256_file(path: str | Path) -> str:
    """Hex sha256 digest of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download_file(
    url: str, dest: str | Path, *, sha256: str | None = None, timeout: float = 30.0
) -> Path:
    """Download ``url`` to ``dest`` atomically, verifying the sha256 on the way.

    The bytes go to a temporary file next to ``dest`` (same folder, so the final rename is
    atomic); only a complete download with the right checksum is moved to ``dest``. On any
    failure the temporary file is removed and ``dest`` is left untouched.

    Args:
        url: where to download from (``http(s)://`` or ``file://``).
        dest: the final path.
        sha256: expected hex digest, or None to skip verification.
        timeout: seconds to wait for the server.

    Returns:
        ``dest`` as a ``Path``.

    Raises:
        DownloadError: when the server cannot be reached or answers with an error.
        ChecksumError: when the bytes do not match ``sha256`` (names both digests).
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as resp:
                for chunk in iter(lambda: resp.read(_CHUNK), b""):
                    digest.update(chunk)
                    out.write(chunk)
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", None) or err
            raise DownloadError(f"could not download {url}: {reason}") from err
        actual = digest.hexdigest()
        if sha256 is not None and actual != sha256.lower():
            raise ChecksumError(
                f"checksum mismatch for {url}: expected sha256 {sha256}, got {actual}; the file "
                "was not kept (a truncated download or a changed file on the server)"
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _how_to_fix(cached: Path) -> str:
    return (
        "To fix it: pass path='/path/to/tinyshakespeare.txt' (any text file works), or copy the "
        f"file to {cached} (set ${CACHE_ENV} to use another folder), or train offline on the "
        "synthetic corpus: CharCorpusDataModule(fallback='grammar') or "
        "GrammarDataModule(task='lm')."
    )


def fetch_corpus(
    path: str | Path | None = None,
    *,
    url: str = DEFAULT_URL,
    sha256: str | None = TINY_SHAKESPEARE_SHA256,
    cache_dir: str | Path | None = None,
    filename: str = TINY_SHAKESPEARE_FILENAME,
    timeout: float = 30.0,
) -> Path:
    """Return a local path to the corpus, downloading it into the cache if needed.

    Args:
        path: a file chosen by the user; used as is (a checksum mismatch only warns).
        url: download source when no ``path`` is given and no valid cached copy exists.
        sha256: expected digest of the corpus; None disables verification.
        cache_dir: cache folder (default :func:`default_cache_dir`).
        filename: name of the cached file.
        timeout: seconds to wait for the server.

    Returns:
        The path of a readable text file.

    Raises:
        FileNotFoundError: if ``path`` is given but does not exist.
        ChecksumError: if a fresh download has the wrong checksum (nothing is cached).
        CorpusUnavailableError: if the download fails and nothing is cached; the message says
            how to fix it.
    """
    if path is not None:
        path = Path(path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"path={str(path)!r} does not exist or is not a file")
        if sha256 is not None:
            actual = sha256_file(path)
            if actual != sha256.lower():
                warnings.warn(
                    f"{path} has sha256 {actual}, not the expected {sha256}: using it anyway "
                    "(pass sha256=None to skip this check for your own text)",
                    stacklevel=2,
                )
        return path

    cached = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    cached = cached / filename
    if cached.is_file():
        if sha256 is None or sha256_file(cached) == sha256.lower():
            return cached
        warnings.warn(f"cached {cached} fails its checksum; downloading it again", stacklevel=2)
    try:
        return download_file(url, cached, sha256=sha256, timeout=timeout)
    except ChecksumError:
        raise
    except DownloadError as err:
        reason = f"{err}, and there is no cached copy at {cached}."
        raise CorpusUnavailableError(f"{reason} {_how_to_fix(cached)}", reason) from err
