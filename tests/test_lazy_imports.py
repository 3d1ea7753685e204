"""Importing the kit's subpackages stays cheap: Lightning loads only when a name needs it."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_plain_data_names_do_not_import_lightning() -> None:
    code = (
        "import sys, transformer_lab.data as d, transformer_lab.training as t;"
        "d.make_task; t.warmup_cosine_lambda;"
        "print('lightning' in sys.modules)"
    )
    assert _run(code) == "False"


def test_lazy_names_resolve_and_unknown_names_fail() -> None:
    import transformer_lab.data as data
    import transformer_lab.training as training
    from transformer_lab.data.datamodules import SyntheticDataModule
    from transformer_lab.training.modules import OptimConfig

    assert data.SyntheticDataModule is SyntheticDataModule
    assert training.OptimConfig is OptimConfig
    assert set(data.__all__) <= set(dir(data))
    assert set(training.__all__) <= set(dir(training))
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        data.nope  # noqa: B018
