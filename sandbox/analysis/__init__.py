"""Looking at what a trained mixer learned, and at results across runs.

metrics     pure functions on tensors (similarity, entropy, receptive field, usage, PCA, t-SNE)
stats       effects with intervals, rules and verdicts, seeds to plan (scipy.stats)
capture     load a run directory and collect per-layer capture dicts on test batches
plots       matplotlib (Agg) figures built from capture dicts
report      ``sandbox inspect``: pictures + numbers -> RUN_DIR/inspect/ and TensorBoard
plot_sweep  ``sandbox plot``: curves and heatmaps from a sweep's results
compare     ``sandbox compare``: two variants x seeds, the effect, its interval and a verdict
cli         the subcommands' argument parsers
"""
