"""The `stoker` command line: one module per command group, heavy imports inside commands."""
