"""GPT-2 in the kit's GPT, against Hugging Face's ``GPT2LMHeadModel`` (an implementation the kit
did not write), offline.

A randomly initialised ``GPT2LMHeadModel`` of a small ``GPT2Config`` gives its weights to the
kit's GPT built with (a) the kit's ``CausalSelfAttention`` and (b) two attentions written as
lab-08 students write them (from its mistake catalogue's correct variants): the
logits are equal within float32 tolerance, greedy continuations are the same tokens with and
without the KV cache, and the attention maps are Hugging Face's. The loading path runs end to
end from a checkpoint saved by ``save_pretrained`` and served by a loopback hub
(``hub_support.LoopbackHub``); offline it fails in one line.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from hub_support import LoopbackHub, closed_port, save_tiny_gpt2, save_tiny_tokenizer
from test_lab08_checks import EinsumAttention, SolutionAttention
from torch import nn

from transformer_lab import gpt2
from transformer_lab.generation import generate
from transformer_lab.models import CausalSelfAttention

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed: pip install 'transformer-lab[dev]'"
)
pytest.importorskip("safetensors", reason="pip install 'transformer-lab[gpt2]'")


# Two students' attentions (lab 08's catalogue): the notebook's answer, and one written out
# with einsum that reads its offset from the cache.
ATTENTIONS = pytest.mark.parametrize(
    "attention",
    [None, CausalSelfAttention, SolutionAttention, EinsumAttention],
    ids=["kit", "kit-class", "student", "student-einsum"],
)
TOL = {"rtol": 1e-4, "atol": 1e-5}  # float32 rounding in a different order of operations


@pytest.fixture(scope="module")
def hf_model() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=4, vocab_size=100, n_positions=64, bos_token_id=0,
        eos_token_id=0, attn_implementation="eager",
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # GPT-2's init (std 0.02) hides a wrong GELU under the tolerance
        for name, p in model.named_parameters():
            p.normal_(1.0 if "ln" in name and name.endswith("weight") else 0.0, 0.3)
    return model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GPT-2 as a hub repository holds it: config, safetensors weights, tokenizer."""
    return save_tiny_gpt2(tmp_path_factory.mktemp("tiny_gpt2"))


def ours(hf_model: nn.Module, attention: type[nn.Module] | None) -> nn.Module:
    model = gpt2.build_gpt(gpt2.config_from_hf(hf_model.config.to_dict()), attention)
    gpt2.load_gpt2_weights(model, hf_model.state_dict())
    return model.eval()


@ATTENTIONS
def test_logits_equal_hugging_faces(hf_model: nn.Module, attention: type | None) -> None:
    model = ours(hf_model, attention)
    if attention is SolutionAttention:
        assert isinstance(model.blocks[0].attn, SolutionAttention)
    idx = torch.randint(0, 100, (3, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = hf_model(idx).logits
        torch.testing.assert_close(model(idx), theirs, **TOL)
        cache = model.new_kv_cache(3)  # the same logits read in pieces through the cache
        pieces = [model(idx[:, a:b], cache) for a, b in ((0, 17), (17, 18), (18, 40))]
    torch.testing.assert_close(torch.cat(pieces, dim=1), theirs, **TOL)


@ATTENTIONS
@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_continuations_are_hugging_faces(
    hf_model: nn.Module, attention: type | None, use_cache: bool
) -> None:
    model = ours(hf_model, attention)
    prompt = torch.randint(0, 100, (2, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        theirs = hf_model.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=40, do_sample=False,
            use_cache=use_cache, pad_token_id=0, min_new_tokens=40,
        )  # fmt: skip
    mine = generate(model, prompt, 40, temperature=0.0, use_cache=use_cache)
    assert torch.equal(mine, theirs)


@ATTENTIONS
def test_attention_maps_are_hugging_faces(hf_model: nn.Module, attention: type | None) -> None:
    model = ours(hf_model, attention)
    idx = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(3))
    maps = gpt2.attention_maps(model, idx)
    with torch.no_grad():
        theirs = hf_model(idx, output_attentions=True).attentions
    assert len(maps) == 2 and maps[0].shape == (2, 4, 12, 12)
    for mine, reference in zip(maps, theirs, strict=True):
        torch.testing.assert_close(mine, reference, **TOL)


def test_the_hub_path_downloads_once_then_reads_the_cache(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = transformers.GPT2LMHeadModel.from_pretrained(checkpoint).eval()
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    idx = torch.tensor([[5, 17, 42, 9, 250]])
    with LoopbackHub(checkpoint) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        model, tokenizer = gpt2.from_pretrained("gpt2", SolutionAttention)
        assert sorted(hub.downloads) == sorted(gpt2.GPT2_FILES)
        again, _ = gpt2.from_pretrained("gpt2", SolutionAttention)
        assert len(hub.downloads) == len(gpt2.GPT2_FILES)  # the cache answered
    assert not model.training and type(model.blocks[1].attn).__mro__[1] is SolutionAttention
    with torch.no_grad():
        torch.testing.assert_close(model(idx), reference(idx).logits, **TOL)
        torch.testing.assert_close(again(idx), reference(idx).logits, **TOL)
    monkeypatch.setenv("HF_ENDPOINT", closed_port())  # offline now: the cached copy still loads
    cached, _ = gpt2.from_pretrained("gpt2")
    assert sum(p.numel() for p in cached.parameters()) == reference.num_parameters()
    assert tokenizer.decode(tokenizer.encode("The man ate the fish")) == "The man ate the fish"


def test_a_dropped_download_resumes_where_it_stopped(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 8192)  # a 150 kB file in many chunks
    weights = (checkpoint / "model.safetensors").read_bytes()
    with LoopbackHub(checkpoint, cut="model.safetensors") as hub:
        files = gpt2.download_gpt2("gpt2", endpoint=hub.endpoint, cache_dir=tmp_path)
    [asked] = hub.ranges  # the second request asks for the rest only
    assert 0 < int(asked.removeprefix("bytes=").rstrip("-")) <= len(weights) // 2
    assert files["model.safetensors"].read_bytes() == weights


def test_a_local_folder_loads_without_a_hub(checkpoint: Path) -> None:
    model, tokenizer = gpt2.from_pretrained(checkpoint, SolutionAttention, dtype=torch.float64)
    assert model.tok_emb.weight.dtype == torch.float64 and tokenizer.eos_id is not None
    assert model.config.activation == "gelu_tanh" and model.config.norm_eps == 1e-5
    with pytest.raises(FileNotFoundError, match="lacks"):
        gpt2.from_pretrained(checkpoint / "..")


def test_offline_without_a_copy_is_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(gpt2.GPT2UnavailableError) as info:
        gpt2.from_pretrained("gpt2", endpoint=closed_port(), cache_dir=tmp_path)
    message = str(info.value)
    assert "\n" not in message and "cannot be reached" in message and "openai-community" in message


def test_a_file_the_hub_lacks_is_one_clear_line(checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "config.json").write_bytes((checkpoint / "config.json").read_bytes())
    with LoopbackHub(tmp_path / "repo") as hub, pytest.raises(gpt2.GPT2UnavailableError) as info:
        gpt2.download_gpt2("someone/tiny", endpoint=hub.endpoint, cache_dir=tmp_path / "cache")
    assert "model.safetensors could not be downloaded" in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_extras_say_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real packages, by the names PyPI knows (the student wheel declares no extras; no
    ``transformer-lab[gpt2]`` exists there), and to re-run the setup cell."""
    import tomllib

    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(gpt2.GPT2UnavailableError) as raised:
        gpt2.download_gpt2("gpt2")
    said = str(raised.value)
    assert "[gpt2]" not in said and "transformer-lab" not in said and "\n" not in said
    assert "%pip install 'huggingface_hub>=0.20' 'safetensors>=0.4' 'tokenizers>=0.15'" in said
    assert said.endswith("then re-run the setup cell")
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert list(gpt2.PACKAGES) == project["project"]["optional-dependencies"]["gpt2"]


def test_the_tokenizer_is_byte_level_bpe_read_from_its_file(tmp_path: Path) -> None:
    path = save_tiny_tokenizer(tmp_path / "tokenizer.json")
    tokenizer = gpt2.GPT2Tokenizer(path)
    reference = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path))
    for text in ("The man ate the fish.", "naïve café 🐟\n\tunseen WORDS", ""):
        ids = tokenizer.encode(text)
        assert ids == reference.encode(text)
        assert tokenizer.decode(ids) == text  # byte level: nothing is ever unknown
    assert "".join(tokenizer.tokenize("The man ate")) == "The man ate"
    assert tokenizer.vocab_size == 300 and tokenizer.eos_id == 0
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="is not a tokenizer file"):
        gpt2.GPT2Tokenizer(tmp_path / "bad.json")


def test_what_does_not_fit_is_named(hf_model: nn.Module) -> None:
    config = gpt2.config_from_hf(hf_model.config.to_dict())
    state = dict(hf_model.state_dict())
    state["transformer.h.1.mlp.c_fc.weight"] = state["transformer.h.1.mlp.c_fc.weight"].t()
    with pytest.raises(ValueError, match=r"h\.1\.mlp\.c_fc\.weight: .*shape \(128, 32\)"):
        gpt2.load_gpt2_weights(gpt2.build_gpt(config), state)
    del state["transformer.ln_f.bias"]
    with pytest.raises(ValueError, match=r"missing \['ln_f\.bias'\]"):
        gpt2.load_gpt2_weights(gpt2.build_gpt(config), state)
    with pytest.raises(ValueError, match="scale_attn_by_inverse_layer_idx=True"):
        gpt2.config_from_hf({**hf_model.config.to_dict(), "scale_attn_by_inverse_layer_idx": True})

    class Separate(nn.Module):  # three projections instead of GPT-2's fused one
        def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
            super().__init__()
            self.q_proj = nn.Linear(d_model, d_model)

    with pytest.raises(TypeError, match=r"Separate\.qkv_proj must be an nn\.Linear"):
        gpt2.build_gpt(config, Separate)


def test_the_precision_picks_the_dtype() -> None:
    assert gpt2.inference_dtype("16-mixed") is torch.float16  # a T4
    assert gpt2.inference_dtype("bf16-mixed") is torch.bfloat16
    assert gpt2.inference_dtype("32-true") is torch.float32
