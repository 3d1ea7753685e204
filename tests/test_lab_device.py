"""``lab.choose_device``: the GPU for the labs that gain from it, the CPU for the tiny-model ones.

No GPU is needed: the accelerator PyTorch would report is replaced. Issue 39 measured labs 01,
03, 04, 05 and 06 slower on an H200 than on a quiet 2-core CPU (their models are launch-bound);
which labs those are is ``lab.CPU_LABS``, and ``benchmarks/gpu.sh`` checks the outcome on a GPU.
"""

from __future__ import annotations

import pytest

from transformer_lab import lab
from transformer_lab.training import devices


@pytest.fixture
def gpu_present(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "choose_accelerator", lambda: "cuda")
    monkeypatch.delenv(lab.DEVICE_ENV, raising=False)


def test_a_tiny_model_lab_runs_on_the_cpu_and_says_why(gpu_present: None) -> None:
    device, note = lab.choose_device("03_multi_head_attention")
    assert device == "cpu"
    assert note is not None
    assert "too small to gain from it" in note and "TRANSFORMER_LAB_DEVICE=cuda" in note


@pytest.mark.parametrize("name", ["02_self_attention", "07_nlp_pipeline", "08_language_models"])
def test_the_labs_that_gain_from_a_gpu_use_it(gpu_present: None, name: str) -> None:
    assert lab.choose_device(name) == ("cuda", None)


def test_the_environment_decides_when_set(
    gpu_present: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(lab.DEVICE_ENV, "cuda")
    assert lab.choose_device("03_multi_head_attention") == ("cuda", None)
    monkeypatch.setenv(lab.DEVICE_ENV, "CPU")
    assert lab.choose_device("08_language_models") == ("cpu", None)
    monkeypatch.setenv(lab.DEVICE_ENV, "tpu")
    with pytest.raises(ValueError, match="TRANSFORMER_LAB_DEVICE='tpu' is not one of"):
        lab.choose_device("08_language_models")


def test_no_gpu_means_the_cpu_and_asking_for_one_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(devices, "choose_accelerator", lambda: "cpu")
    monkeypatch.delenv(lab.DEVICE_ENV, raising=False)
    assert lab.choose_device("08_language_models") == ("cpu", None)
    monkeypatch.setenv(lab.DEVICE_ENV, "cuda")
    with pytest.raises(ValueError, match="sees no CUDA GPU"):
        lab.choose_device("08_language_models")


def test_every_cpu_lab_is_a_lab_of_the_course() -> None:
    from transformer_lab.checks import spec

    assert {s.lab for s in spec.all_specs()} >= lab.CPU_LABS
