"""Sweeps: one scenario over a grid of overrides, a row per point, run by worker processes
of their own (a time limit per point) or a Dask cluster, kept durably and resumed by
fingerprint.

Run ``clustersim sweep scenarios/llama3-8b-fsdp-h100.toml --grid training.seq_len=2048,4096``
or ``sim.sweep(...)``; docs/sweeps.md. The room below the studies and the planner,
which both sweep with it. Modules: :mod:`.grid` (the grid, fingerprints, resuming,
:func:`.grid.sweep`), :mod:`.pool` (where points run), :mod:`.sinks` (where rows are kept).
"""
