"""Shared test setup: one thread per test process, seeded RNG, paths to shared data."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("TRANSFORMER_LAB_PROFILE", "grading")

import pytest
import torch

# Two cores: pytest runs two workers (pytest -n 2), each with one thread, so they never thrash.
torch.set_num_threads(int(os.environ.get("TRANSFORMER_LAB_TEST_THREADS", "1")))

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
TINY_SHAKESPEARE = SHARED_DATA / "tinyshakespeare.txt"


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def tiny_shakespeare_path() -> Path:
    if not TINY_SHAKESPEARE.exists():
        pytest.skip(f"{TINY_SHAKESPEARE} is not present")
    return TINY_SHAKESPEARE
