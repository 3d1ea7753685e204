"""Structure of the lab 08 source notebook, and what its experiments show (no nbgrader).

The checks every lab shares (metadata and markers, the locked setup cell, the checks the test
cells call, the solution against its own test cells, a clean release, the nbgrader round trip)
are inherited from :class:`notebook_support.LabNotebookTests`; the methods here are particular
to lab 08: the curriculum's signatures, the demos on the student's own code, the training cell's
use of the session, and a run of every code cell in the grading profile whose printed results
must tell the lab's story (the cache changes nothing but the speed; forgetting its offset ruins
the text; the counts reproduce the lecture's numbers).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from notebook_support import LabNotebookTests, meta, run_all_cells

from transformer_lab.checks import lab08
from transformer_lab.grading.hidden import lab08 as hidden08


class TestLab08(LabNotebookTests):
    LAB = "08_language_models"
    CHECKS = lab08
    HIDDEN = hidden08
    TEST_CELLS = 18
    LEAK = "past = S - T  # P: positions stored before these tokens"  # a line of the model answer

    def test_the_attention_exercise_has_two_solution_regions(self, notebook: Any) -> None:
        # names, signatures and points: the spec's (test_agrees_with_its_spec)
        answers = {meta(c)["grade_id"]: c.source for c in notebook.cells if meta(c).get("solution")}
        assert answers["CausalSelfAttention"].count("### BEGIN SOLUTION") == 2

    def test_every_graded_function_has_a_demo_on_the_students_own_code(self, notebook: Any) -> None:
        demos = "\n".join(
            c.source for c in notebook.cells if meta(c).get("grade_id", "").startswith("demo_")
        )
        for part in self.spec.parts.values():  # the check its answer is saved on
            assert re.search(rf"yours_or_kit\(\s*{part.name},\s*check=lab08\.{part.check},", demos)

    def test_written_answers_have_a_rubric(self, notebook: Any) -> None:
        written = [c for c in notebook.cells if c.cell_type == "markdown" and meta(c).get("grade")]
        assert [(meta(c)["grade_id"], meta(c)["points"]) for c in written] == [
            ("written_offset", 2),
            ("written_scale", 3),
            ("written_cache", 2),
        ]
        for cell in written:
            assert meta(cell)["solution"] and "rubric" in cell.source.lower()
            assert "1 point" in cell.source

    def test_the_intro_states_measured_times_and_reading(self, notebook: Any) -> None:
        intro = notebook.cells[0].source
        assert re.search(r"\*\*Time:\*\* about [\d.]+ hours", intro)
        assert "grading profile" in intro and "full profile" in intro and "estimate" in intro
        assert "TIME_" not in intro
        assert re.search(
            r"\*\*Reading:\*\* Prince, \*Understanding Deep Learning\*, section 12\.7 ", intro
        )
        for part in ("12.7.1", "12.7.2", "12.7.3", "12.7.4"):
            assert part in intro

    def test_training_cells_follow_the_session(self, notebook: Any) -> None:
        source = "\n".join(c.source for c in notebook.cells if c.cell_type == "code")
        assert "session.precision" in source and "session.runs" in source
        assert "session.grading" in source and "tempfile" not in source
        assert "CausalLMModule(" in source and "make_trainer(" in source
        assert 'fallback="grammar"' in source  # offline: the synthetic corpus
        assert "OFFSET_" not in "\n".join(c.source for c in notebook.cells)

    def test_the_corpus_advice_names_an_editable_setting_that_works(
        self, notebook: Any, tmp_path: Path
    ) -> None:
        """The fallback warning's advice (set CORPUS_PATH) can be followed: an unlocked settings
        cell holds it, in the release too, and the full profile's corpus is then that file."""
        from notebook_support import release_path

        def settings(nb: Any) -> list[Any]:
            return [
                c
                for c in nb.cells
                if c.cell_type == "code" and c.source.startswith("# Your settings")
            ]

        assert any("CORPUS_PATH = None" in c.source for c in settings(notebook))
        assert all(not meta(c).get("locked") for c in settings(notebook))
        if release_path(self.LAB).exists():
            import nbformat

            release = nbformat.read(str(release_path(self.LAB)), as_version=4)
            found = [c for c in settings(release) if "CORPUS_PATH" in c.source]
            assert found and found[0].metadata.get("editable", True), found
        build = next(c for c in notebook.cells if meta(c).get("grade_id") == "demo_build")
        assert '"path": CORPUS_PATH' in build.source and 'advice="set CORPUS_PATH' in build.source
        text = tmp_path / "my_corpus.txt"
        text.write_text("to be, or not to be, that is the question.\n" * 300)
        namespace: dict[str, Any] = {"CORPUS_PATH": str(text)}  # as the settings cell would
        cells = ("setup", "demo_gpt_diagram", "CausalSelfAttention", "demo_attention", "demo_build")
        out = run_all_cells(notebook, tmp_path, "full", only=cells, namespace=namespace)
        assert namespace["data"].source == str(text) and f"corpus: your {text}" in out

    @pytest.fixture(scope="class")
    def grading_run(
        self, notebook: Any, tmp_path_factory: pytest.TempPathFactory
    ) -> tuple[str, dict[str, Any], Path]:
        """Every code cell, in order, in the grading profile: what it printed, its globals, cwd."""
        cwd = tmp_path_factory.mktemp("lab08_run")
        namespace: dict[str, Any] = {}
        return run_all_cells(notebook, cwd, namespace=namespace), namespace, cwd

    @pytest.mark.slow
    def test_the_experiments_tell_the_story(
        self, grading_run: tuple[str, dict[str, Any], Path]
    ) -> None:
        """Every code cell, in order, in the grading profile: the printed results."""
        text, _, tmp_path = grading_run
        assert "(This uses your CausalSelfAttention.)" in text
        assert "(This uses your generate.)" in text
        gap = float(re.search(r"through the cache: largest difference ([\d.e+-]+)", text)[1])
        assert gap < 1e-5
        assert "the synthetic grammar corpus" in text
        loss = float(re.search(r"validation loss ([\d.]+) nats per character", text)[1])
        assert loss < 1.6  # the synthetic corpus is easy: a uniform guess is ~3.3
        runs = tmp_path / "runs" / "08_language_models"
        assert (runs / "synthetic_corpus.txt").is_file()
        assert list((runs / "char_lm").glob("version_*/metrics.csv"))
        assert text.count("the same tokens: True") == 2
        losses = dict(re.findall(r"^\s*([a-z ,]+): ([\d.]+) nats per character$", text, re.M))
        parallel = float(losses["one parallel pass"])
        assert abs(float(losses["through the cache"]) - parallel) < 1e-3
        assert float(losses["through the cache, offset forgotten"]) > parallel + 0.5
        ours = re.search(r"gpt_param_count gives ([\d,]+); PyTorch counts ([\d,]+)", text)
        assert ours[1] == ours[2]
        assert "124,439,808" in text and "174,604,259,328" in text
        assert "3.14e+23 FLOPs" in text and "9.66 GB" in text
        assert re.search(r"on one A100 \(bf16\) at 40%: 29,1\d\d GPU-days", text)
        gpt2_lines = [line for line in text.splitlines() if line.startswith("GPT-2")]
        assert gpt2_lines == [
            "GPT-2: skipped in the grading profile, which downloads nothing "
            "(run the full profile to meet it)."
        ]

    @pytest.mark.slow
    def test_the_timing_cells_gpu_branch_decodes_compiled_with_the_students_tokens(
        self,
        notebook: Any,
        grading_run: tuple[str, dict[str, Any], Path],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """On CUDA the timing cell also decodes through the compiled cached step (issue 39: the
        eager cache gains nothing on a GPU). Its branch, run here on the CPU after the grading
        run (eager backend, CUDA's synchronisation a no-op), prints the speed-up, the seconds
        the compilation took and greedy tokens equal to the student's model's."""
        import contextlib
        import io

        import torch

        from transformer_lab import generation

        _, namespace, _ = grading_run
        cell = next(c for c in notebook.cells if "kit_attention_copy" in c.source)
        branch = 'if session.device.type == "cuda":  # the cached step'
        assert branch in cell.source
        source = cell.source.replace(branch, "if True:  # the cached step")
        compile_step = generation.compile_decode_step
        monkeypatch.setattr(
            generation,
            "compile_decode_step",
            lambda model, batch, options=True: compile_step(model, batch, {"backend": "eager"}),
        )
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(source, "<timing cell>", "exec"), dict(namespace))
        assert re.search(
            r"^batch 1, compiled cached step \(CUDA graphs\): \d+ ms: [\d.]+x faster than without "
            r"the cache; compiling took \d+ s, once; greedy tokens the same as yours: True$",
            printed.getvalue(),
            re.M,
        ), printed.getvalue()
        why = next(c for c in notebook.cells if c.source.startswith("What the cache buys"))
        assert "launching" in why.source and "CUDA graph" in why.source

    @pytest.mark.slow
    def test_the_gpt2_section_runs_against_a_loopback_hub(
        self,
        notebook: Any,
        grading_run: tuple[str, dict[str, Any], Path],
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """Section 6 as the full profile runs it, on the grading run's models: a tiny GPT-2
        served from 127.0.0.1 as the hub; then offline, where it says so in one line."""
        pytest.importorskip("transformers", reason="transformers is not installed (dev extra)")
        from hub_support import LoopbackHub, closed_port, save_tiny_gpt2

        _, namespace, cwd = grading_run
        namespace["GRADING"] = False  # the full profile's branch
        section = [
            meta(c)["grade_id"]
            for c in notebook.cells
            if "demo_gpt2" in meta(c).get("grade_id", "")
        ]
        assert section[0] == "demo_gpt2_load" and len(section) == 6
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
        with LoopbackHub(save_tiny_gpt2(tmp_path / "tiny_gpt2")) as hub:
            monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
            text = run_all_cells(notebook, cwd, only=section, namespace=namespace)
        assert sorted(hub.downloads) == ["config.json", "model.safetensors", "tokenizer.json"]
        assert re.search(
            r"gpt2: your CausalSelfAttention in each of its 2 blocks, torch.float32", text
        )
        assert text.count("--- greedy:    'The man ate the fish") == 1
        assert text.count("--- top-p 0.9: 'The fish ate the man") == 1
        assert re.search(r"lab 07's BPE \(500 merges, this lab's corpus\): \d+ tokens \[", text)
        assert re.search(r"GPT-2's byte-level BPE \(300 tokens\): \d+ tokens \['The', ' man'", text)
        gpt2_nats = float(re.search(r"GPT-2 \(gpt2\): ([\d.]+) nats per character", text)[1])
        char_nats = float(re.search(r"your char LM: ([\d.]+) nats per character", text)[1])
        assert char_nats < 1.6 < gpt2_nats  # a trained char LM against random weights
        ours = re.search(r"= ([\d,]+); PyTorch counts ([\d,]+) in the loaded gpt2", text)
        assert ours[1] == ours[2]
        assert re.search(
            r"GPT-2 on cpu: 32 tokens without the cache .* the same tokens: True", text
        )
        assert re.search(
            r"'it' -> 'animal': the largest weights are \[[\d., ]+\] \(layer, head", text
        )

        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_cache"))
        monkeypatch.setenv("HF_ENDPOINT", closed_port())
        text = run_all_cells(notebook, cwd, only=section, namespace=namespace)
        assert len(text.splitlines()) == 1 and "cannot be reached (offline?)" in text


def test_the_lab08_diagrams_draw_the_stack_the_cache_and_the_scale() -> None:
    import torch
    from matplotlib.figure import Figure

    from transformer_lab import diagrams

    fig = diagrams.gpt_diagram({"a": {"layers": "1"}, "b": {"layers": "2"}})
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    assert isinstance(diagrams.gpt_diagram(), Figure)
    fig = diagrams.kv_cache_diagram(prompt=3, new=6)
    assert "(33 in all)" in fig.axes[0].get_title() and "(8)" in fig.axes[1].get_title()
    fig = diagrams.dependency_grid({"causal": torch.ones(4, 4).tril()})
    assert "6 exact zeros" in fig.axes[0].get_title()
    points = [
        {"family": "f", "label": "a", "d_model": 8, "params": 1e3, "published": 1e3, "flops": 1e9},
        {"family": "f", "label": "b", "d_model": 16, "params": 4e3, "flops": None},
    ]
    assert len(diagrams.scale_chart(points).axes) == 2
    with pytest.raises(ValueError, match="nothing to draw"):
        diagrams.scale_chart([])
    with pytest.raises(ValueError, match="not \\(T, T\\)"):
        diagrams.dependency_grid({"bad": torch.ones(2, 3)})
    with pytest.raises(ValueError, match="must be >= 1"):
        diagrams.kv_cache_diagram(prompt=0)


def test_the_full_profile_reads_tiny_shakespeare_checked_from_the_cache(
    tiny_shakespeare_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The full profile's data cell: Tiny Shakespeare from the download cache, sha256 checked."""
    from notebook_support import read_source

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "tinyshakespeare.txt").write_bytes(tiny_shakespeare_path.read_bytes())
    monkeypatch.setenv("TRANSFORMER_LAB_CACHE", str(cache))
    wanted = ("setup", "demo_gpt_diagram", "CausalSelfAttention", "demo_attention", "demo_build")
    settings = {"CORPUS_PATH": None, "GPT2_SIZE": "gpt2"}  # the unlocked "Your settings" cell
    notebook = read_source("08_language_models")
    text = run_all_cells(notebook, tmp_path, "full", only=wanted, namespace=settings)
    assert "corpus: Tiny Shakespeare (sha256 verified)" in text and "69 token ids" in text
    assert "818,560 parameters" in text  # 4 layers of width 128, context 128
