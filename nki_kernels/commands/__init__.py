"""Subcommands of the `nki-kernels` CLI, one module each.

A command module defines:
    NAME: str                         the subcommand (e.g. "doctor")
    HELP: str                         one line for `nki-kernels --help`
    add_arguments(parser) -> None     its options on an argparse sub-parser
    run(args) -> int                  the work; the return value is the exit status
Keep module-level imports light (the CLI imports every command module to build its
help); import torch, optuna and the like inside `run`.
"""
