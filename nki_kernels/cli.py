"""`nki-kernels`: the project's command line.

A small dispatcher: every module of `nki_kernels.commands` that defines `NAME` is a
subcommand (see that package's docstring for the protocol), so a new command is a new
module and this file does not change.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from . import __version__, commands

TRACEBACK_ENV_VAR = "NKI_KERNELS_TRACEBACK"
# what a user's bad input raises inside a command; anything else is a bug and keeps its
# traceback. With $NKI_KERNELS_TRACEBACK=1 these keep theirs too.
USER_ERRORS = (ValueError, TypeError, LookupError, OSError, ImportError)
# optional dependencies and the extra that installs each
EXTRAS = {"transformers": "hf", "matplotlib": "dev", "scipy": "conformance"}


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line naming the option."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


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
    parser = _Parser(
        prog="nki-kernels",
        description="NKI kernels for AWS Trainium: environment checks, benchmarks, tuning.",
    )
    parser.add_argument("--version", action="version", version=f"nki-kernels {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in discover().items():
        p = sub.add_parser(name, help=module.HELP, description=module.__doc__)
        module.add_arguments(p)
        p.set_defaults(_run=module.run, _parser=p, _command=name)
    return parser


def _option_named(parser: argparse.ArgumentParser, message: str) -> str:
    """`message` with a leading "name:" written as the option the user typed ("--name:")."""
    head, sep, rest = message.partition(":")
    if not sep or " " in head.strip():
        return message
    for action in parser._actions:
        if action.dest == head.strip() and action.option_strings:
            return f"{action.option_strings[-1]}:{rest}"
    return message


def user_error(exc: BaseException, parser: argparse.ArgumentParser | None = None) -> str:
    """One line for a user's error: the message (naming the option), or for a missing
    optional dependency the extra that installs it."""
    if isinstance(exc, ImportError) and exc.name:
        top = exc.name.split(".")[0]
        if top in EXTRAS:
            return f"needs {top}: pip install 'nki-kernels[{EXTRAS[top]}]'"
        if isinstance(exc, ModuleNotFoundError):
            return f"no module named {exc.name!r} (is it on PYTHONPATH?)"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, FileNotFoundError) and exc.filename:
        text = f"{exc.filename}: no such file or directory"
    return _option_named(parser, text) if parser is not None else text


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: sys.argv[1:]), run the command, return its exit status. A
    user's error is one line on stderr (exit 2); $NKI_KERNELS_TRACEBACK=1 shows the
    traceback."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "_run"):
        parser.print_help()
        return 2
    try:
        return int(args._run(args))
    except USER_ERRORS as exc:
        if os.environ.get(TRACEBACK_ENV_VAR):
            traceback.print_exc()
        line = user_error(exc, args._parser)
        print(f"nki-kernels {args._command}: error: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
