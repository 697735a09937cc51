"""The clustersim version: the one place it is written (pyproject.toml reads it from here,
so the installed package's metadata agrees). ``clustersim --version`` prints it; sweep rows
carry it, and a change of version makes resumed rows stale (docs/sweeps.md)."""

__version__ = "0.1.0"
