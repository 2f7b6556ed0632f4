"""Subcommands of the `vc-attention` console script: one module each, with add_parser() and run()."""
