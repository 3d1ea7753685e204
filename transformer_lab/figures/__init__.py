"""The labs' figures: diagrams drawn in code, one module per lab, and the plots of runs.

Every function returns a ``matplotlib.figure.Figure`` built without pyplot (so it also works
headless and in tests); in Jupyter a returned figure displays itself as the cell's value.

* :mod:`.draw`: the one drawing vocabulary every diagram uses: a box, an arrow, a grid of
  cells, a figure of heat-map panels;
* :mod:`.lab02` ... :mod:`.lab08`: each lab's diagrams (Q/K/V shapes, the head split,
  post- vs pre-norm, masks, the encoder-decoder, BPE and decoding, the GPT stack and its cache);
* :mod:`.plots`: plots of data: loss curves from a run's ``metrics.csv``, attention maps,
  positional encodings.

Every public name is importable from here (``from transformer_lab.figures import mask_grid``,
imported on first use);
``transformer_lab.diagrams`` and ``transformer_lab.plots`` are the older names of the same
functions, kept for the notebooks that import them.
"""

from __future__ import annotations

from transformer_lab._lazy import lazy_exports

#: The diagrams, name -> the module of this package that draws it (``transformer_lab.diagrams``).
DIAGRAMS = {
    "attention_shapes": "lab02",
    "attention_to_text": "lab02",
    "head_split_diagram": "lab03",
    "query_rows_by_head": "lab03",
    "split_merge_figure": "lab03",
    "encoder_block_diagram": "lab04",
    "loss_race": "lab05",
    "mask_grid": "lab05",
    "weight_grid": "lab05",
    "encoder_decoder_diagram": "lab06",
    "teacher_forcing_diagram": "lab06",
    "beam_tree": "lab07",
    "bpe_merges_figure": "lab07",
    "decoding_distributions": "lab07",
    "one_hot_lookup": "lab07",
    "dependency_grid": "lab08",
    "gpt_diagram": "lab08",
    "kv_cache_diagram": "lab08",
    "scale_chart": "lab08",
}
#: The plots of data (``transformer_lab.plots``).
PLOTS = {
    name: "plots"
    for name in (
        "collect_attention",
        "plot_attention_maps",
        "plot_loss_curves",
        "plot_positional_encoding",
        "plot_similarity_vs_distance",
        "read_metrics_csv",
    )
}

__all__ = sorted({**DIAGRAMS, **PLOTS})

__getattr__, __dir__ = lazy_exports(__name__, {**DIAGRAMS, **PLOTS})
