"""Subcommands of the clustersim CLI, one module each."""
