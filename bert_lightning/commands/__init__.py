"""Subcommands of the `bert-lightning` console script, one module each (see `cli.py`)."""
