"""Shared test setup: one thread per test process, seeded RNG, Tiny Shakespeare, a clean checkout.

Tests that need Tiny Shakespeare get it through the kit's own download path (``fetch_corpus``:
download, sha256 check, cache) from a loopback HTTP server that serves a local copy: from
``$TRANSFORMER_LAB_TINY_SHAKESPEARE``, the checkout's neighbour ``../shared/data/`` or the
kit's download cache, whichever holds the verified file. Where none does (a fresh clone on a
machine that never downloaded it), those tests skip and say so; nothing reaches the internet.

The suite also checks that it leaves nothing new in the repository's top folder: every run and
checkpoint a test makes belongs under its ``tmp_path``.
"""

from __future__ import annotations

import collections
import hashlib
import http.server
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("TRANSFORMER_LAB_PROFILE", "grading")
# The judge's drawn cases from one seed: a catalogued mistake costs the same cells every run.
os.environ.setdefault("TRANSFORMER_LAB_DRAW_SEED", "20261204")

import pytest
import torch

# Two cores: pytest runs two workers (pytest -n 2), each with one thread, so they never thrash.
torch.set_num_threads(int(os.environ.get("TRANSFORMER_LAB_TEST_THREADS", "1")))

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
TINY_SHAKESPEARE = SHARED_DATA / "tinyshakespeare.txt"
CORPUS_ENV = "TRANSFORMER_LAB_TINY_SHAKESPEARE"
# Made by tools, not by the tests' own runs.
TOOL_FOLDERS = {".pytest_cache", "__pycache__", ".ruff_cache"}

#: Why a test that needs a system tool skipped: one line naming the Debian package that runs it
#: (shown in pytest's ``-ra`` summary). ``.ci/run`` installs both packages and sets
#: ``TRANSFORMER_LAB_NO_SKIP=bubblewrap,chromium``: there such a skip fails the test instead.
NEEDS = {
    "bubblewrap": "needs a working bubblewrap (0.5+): Debian package `bubblewrap` runs it",
    "chromium": "needs Chromium: Debian package `chromium` runs it",
    "podman": "needs podman with runc: Debian packages `podman` and `runc` run it",
}
NO_SKIP_ENV = "TRANSFORMER_LAB_NO_SKIP"


def _bwrap_works() -> bool:
    """Whether the grader's sandbox works here (installed, and user namespaces allowed)."""
    if shutil.which("bwrap") is None:
        return False
    from transformer_lab.grading.sandbox import find_bwrap

    return find_bwrap() is not None


def chromium_path() -> str | None:
    """Debian's Chromium (the browser tests drive it through playwright), or None."""
    import importlib.util

    found = shutil.which("chromium")
    return found if found and importlib.util.find_spec("playwright") is not None else None


#: Tests that grade in the bubblewrap sandbox: without it they skip, naming the package.
#: Round trips that test a lab, not the sandbox, grade without it there, asked for explicitly
#: (``labs grade`` refuses to unless told ``--unsandboxed``).
HAVE_BWRAP = _bwrap_works()
GRADING_SANDBOX = "required" if HAVE_BWRAP else "off"
needs_bwrap = pytest.mark.skipif(not HAVE_BWRAP, reason=NEEDS["bubblewrap"])


#: Modules that grade their submissions in one shared class (``judge_support.hand_in``): one
#: xdist worker runs them all (:func:`pytest_xdist_make_scheduler`), so it is graded once.
SHARED_CLASS_MODULES = frozenset(
    {"test_judge.py", "test_judge_hidden_leaks.py", "test_judge_unscanned.py"}
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules with a slow test first, then the others, most tests first; each module's tests
    kept together and in order.

    ``--dist loadscope`` hands each worker whole modules in collection order, so the longest
    work (sandboxed gradings, trainings, fresh venvs; then the modules of hundreds of quick
    tests, such as the mistake catalogue's) starts first and two workers finish together
    instead of one running a long module alone at the end.
    """
    module = {item: item.nodeid.split("::")[0] for item in items}
    slow = {module[item] for item in items if item.get_closest_marker("slow")}
    size = collections.Counter(module.values())
    # (A slow module's time is its slow tests', whatever their number: those keep their order.)
    items.sort(
        key=lambda item: (
            module[item] not in slow,
            0 if module[item] in slow else -size[module[item]],
        )
    )
    from judge_support import HANDED_IN_BY

    for lab, modules in HANDED_IN_BY.items():
        if not modules <= SHARED_CLASS_MODULES:
            raise pytest.UsageError(
                f"{sorted(modules - SHARED_CLASS_MODULES)} hand in to {lab}'s shared class but "
                "are not in tests/conftest.py's SHARED_CLASS_MODULES: xdist would grade it twice"
            )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadscope`` with the modules of :data:`SHARED_CLASS_MODULES` as one scope.

    A shared class is graded once per worker process; run on two workers, its modules would
    grade it twice. (pytest-xdist's own ``xdist_group`` marks are ignored under pytest 9.)
    """
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedClassScopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::")[0]
            if Path(module).name in SHARED_CLASS_MODULES:
                return "the modules of SHARED_CLASS_MODULES"
            return super()._split_scope(nodeid)

    return SharedClassScopes(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """Where ``$TRANSFORMER_LAB_NO_SKIP`` names a tool (CI), a test skipped for want of it fails."""
    outcome = yield
    report = outcome.get_result()
    strict = {t.strip() for t in os.environ.get(NO_SKIP_ENV, "").split(",") if t.strip()}
    if not (report.skipped and strict) or not isinstance(report.longrepr, tuple):
        return
    reason = str(report.longrepr[2])
    for tool in strict & NEEDS.keys():
        if NEEDS[tool] in reason:
            report.outcome = "failed"
            report.longrepr = f"skipped where {NO_SKIP_ENV} requires {tool}: {reason}"


class LoopbackServer:
    """An HTTP server on 127.0.0.1 that serves fixed bytes at every path and counts requests."""

    def __init__(self, payload: bytes, content_type: str = "application/octet-stream") -> None:
        self.payload = payload
        self.content_type = content_type
        self.requests = 0
        self.paths: list[str] = []  # what was asked for, in order
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.requests += 1
                outer.paths.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", outer.content_type)
                self.send_header("Content-Length", str(len(outer.payload)))
                self.end_headers()
                self.wfile.write(outer.payload)

            def log_message(self, *args: object) -> None:  # keep pytest output clean
                pass

        # Threads: a browser holds idle (preconnected) sockets open, which would stall one thread.
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/tinyshakespeare.txt"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> LoopbackServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def local_tiny_shakespeare() -> Path | None:
    """A verified copy of Tiny Shakespeare on this machine, or None."""
    from transformer_lab.data.corpus import (
        TINY_SHAKESPEARE_FILENAME,
        TINY_SHAKESPEARE_SHA256,
        default_cache_dir,
    )

    candidates = [
        os.environ.get(CORPUS_ENV, ""),
        TINY_SHAKESPEARE,
        default_cache_dir() / TINY_SHAKESPEARE_FILENAME,
    ]
    for path in (Path(c) for c in candidates if c):
        if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == (
            TINY_SHAKESPEARE_SHA256
        ):
            return path
    return None


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def tiny_shakespeare_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny Shakespeare as the kit downloads it (sha256-checked), served from a local copy."""
    from transformer_lab.data.corpus import fetch_corpus

    source = local_tiny_shakespeare()
    if source is None:
        pytest.skip(
            "Tiny Shakespeare is not on this machine: set $TRANSFORMER_LAB_TINY_SHAKESPEARE to "
            f"a copy, put one at {TINY_SHAKESPEARE}, or download it once with "
            "`python -c 'from transformer_lab.data import fetch_corpus; fetch_corpus()'`"
        )
    with LoopbackServer(source.read_bytes()) as server:
        return fetch_corpus(url=server.url, cache_dir=tmp_path_factory.mktemp("corpus_cache"))


@pytest.fixture(scope="session", autouse=True)
def _nothing_new_in_the_checkout() -> Iterator[None]:
    """Fail the session if a test left a file or folder in the repository's top folder."""
    before = {p.name for p in REPO_ROOT.iterdir()}
    yield
    new = {p.name for p in REPO_ROOT.iterdir()} - before - TOOL_FOLDERS
    assert not new, f"tests wrote into the checkout {REPO_ROOT}: {sorted(new)}"
