"""`nki-kernels`: the project's command line.

A small dispatcher: every module of `nki_kernels.commands` that defines `NAME` is a
subcommand (see that package's docstring for the protocol), so a new command is a new
module and this file does not change.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence
from typing import Any

from . import __version__, commands


class _Broken:
    """Stand-in for a command module that failed to import: the other commands still work."""

    def __init__(self, module: str, error: Exception) -> None:
        self.NAME = module.replace("_", "-")
        self.HELP = f"(unavailable: {type(error).__name__})"
        self.__doc__ = f"The {module} command failed to import: {error!r}"
        self._error = error

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("args", nargs=argparse.REMAINDER)

    def run(self, args: argparse.Namespace) -> int:
        print(f"nki-kernels {self.NAME}: unavailable: {self._error!r}", file=sys.stderr)
        return 1


def discover() -> dict[str, Any]:
    """The subcommand modules of `nki_kernels.commands`, by command name."""
    found: dict[str, Any] = {}
    for info in pkgutil.iter_modules(commands.__path__):
        if info.name.startswith("_"):
            continue
        try:
            module: Any = importlib.import_module(f"{commands.__name__}.{info.name}")
        except Exception as exc:  # one broken command must not take the CLI down
            module = _Broken(info.name, exc)
        name = getattr(module, "NAME", None)
        if name is None:
            continue
        if name in found:
            raise RuntimeError(f"two command modules define NAME={name!r}")
        found[name] = module
    return dict(sorted(found.items()))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one sub-parser per discovered command."""
    parser = argparse.ArgumentParser(
        prog="nki-kernels",
        description="NKI kernels for AWS Trainium: environment checks, benchmarks, tuning.",
    )
    parser.add_argument("--version", action="version", version=f"nki-kernels {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in discover().items():
        p = sub.add_parser(name, help=module.HELP, description=module.__doc__)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: sys.argv[1:]), run the command, return its exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "_run"):
        parser.print_help()
        return 2
    return int(args._run(args))


if __name__ == "__main__":
    sys.exit(main())
