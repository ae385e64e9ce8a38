"""The manual's ledger page keeps two ledgers printed by the CLI, between markers:
`python -m nki_kernels.ledger.docs` rewrites them from the committed rows (and the
ledger cache); `tests/ledger` fails when the page and the CLI disagree.

`python -m nki_kernels.ledger.docs --refresh` first prices every documented command
(`REFRESH`) into the committed ledger rows (`benchmarks/data/ledger_rows.jsonl`; after a
cost-model change: minutes, the MoE backward most of them) and redraws the charts;
`--refresh-stale` prices only the components not committed yet or stale (their kernel,
config or composition changed since they were priced: `stamps`), in the commands that
have one; `--check` lists those components without pricing. Then run
`python scripts/build_readme.py`."""

from __future__ import annotations

import contextlib
import io
import re
import sys
from pathlib import Path
from typing import Any

from ..runtime.atomic_files import write_text_atomic

PAGE = Path(__file__).resolve().parents[2] / "docs" / "readme" / "ledger.md"
LEDGERS = {
    "train": ["--model", "llama3-8b", "--phase", "train", "--seq", "8192"],
    "decode": ["--model", "llama3-8b", "--phase", "decode", "--batch", "64", "--context", "32768"],
}


MODEL_NAMES = ("llama3-8b", "llama3-70b", "mixtral-8x7b", "deepseek-v3-like", "qwen3-moe-like")
# every model at the documented shapes: train and prefill at S = 4096 and 8192 (the
# default), decode at B = 64 x 32K (the default)
MODEL_CASES = [
    ["ledger", "--model", m, *shape]
    for m in MODEL_NAMES
    for shape in (
        ["--phase", "train", "--seq", "8192"],
        ["--phase", "train", "--seq", "4096"],
        ["--phase", "prefill", "--seq", "8192"],
        ["--phase", "prefill", "--seq", "4096"],
        ["--phase", "decode", "--batch", "64", "--context", "32768"],
    )
]
# the commands whose rows are committed: the README's, the manual's, the CLI help's and
# every model's documented shapes; each prints from committed rows, pricing nothing
# (tests/ledger checks it with `needs`)
REFRESH = [
    ["ledger", "--model", "llama3-8b", "--plot", "benchmarks/results/ledger_cost.png"],
    ["ledger", "--model", "llama3-8b", "--phase", "train", "--seq", "8192", "--target", "trn3"],
    ["bench", "--model", "llama3-8b", "--seq", "4096", "--target", "trn2", "--phase", "train"],
    ["ledger", "--model", "mixtral-8x7b", "--phase", "decode", "--batch", "64"],
    [
        "ledger",
        "--model",
        "deepseek-v3-like",
        "--phase",
        "decode",
        "--batch",
        "64",
        "--plot",
        "benchmarks/results/ledger_cost_deepseek.png",
    ],
    *MODEL_CASES,
]


def _ledgers(argv: list[str], store: Any) -> None:
    """Price what the command `argv` prints into `store` (no output)."""
    from ..cli import build_parser
    from .cli_args import default_lnc, plot_steps, step_from_args
    from .ledger import build
    from .models import get_model

    args = build_parser().parse_args(argv)
    target = args.target or "trn2"
    lnc = args.lnc or default_lnc(target)
    impls = ("ours", "native", "aws") if argv[0] == "bench" else ("ours", "native")
    steps = [step_from_args(args)]
    if getattr(args, "plot", None) is not None:
        steps += plot_steps(args)
    for step in steps:
        build(get_model(args.model), step, target, lnc, store, impls=impls)


def needs(argv: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """What the command `argv` would price at run time from the committed rows alone (no
    user cache), and the committed rows it would use that are stale -- without pricing."""
    from .store import RowStore

    store = RowStore(cache=Path("-"), dry=True)
    _ledgers(argv, store)
    return sorted(set(store.missing)), store.stale


def refresh(stale_only: bool = False) -> None:
    """Price the documented commands into the committed ledger rows: every component not
    committed yet or stale (`stale_only`: only the commands that have such a component)."""
    from ..cli import main as cli_main
    from .store import COMMITTED_CACHE

    root = PAGE.parents[2]
    for argv in REFRESH:
        if stale_only:
            missing, stale = needs(argv)
            if not missing and not stale:
                continue
        argv = [a if not a.endswith(".png") else str(root / a) for a in argv]
        print("refresh:", " ".join(argv), flush=True)
        with contextlib.redirect_stdout(io.StringIO()):
            rc = cli_main([*argv, "--refresh-stale", "--cache", str(COMMITTED_CACHE)])
        if rc != 0:
            raise RuntimeError(f"{' '.join(argv)}: exit status {rc}")


def render(name: str) -> str:
    """The CLI's output for one documented ledger (no cache writes)."""
    from ..cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["ledger", *LEDGERS[name], "--cache", "-"])
    if rc != 0:
        raise RuntimeError(f"ledger {name}: exit status {rc}")
    return buf.getvalue().rstrip() + "\n"


def block(name: str, text: str) -> str:
    cmd = "nki-kernels ledger " + " ".join(LEDGERS[name])
    return f"<!-- ledger-{name} -->\n```text\n$ {cmd}\n{text}```\n<!-- /ledger-{name} -->"


def documented(page: str, name: str) -> str | None:
    m = re.search(rf"<!-- ledger-{name} -->.*?<!-- /ledger-{name} -->", page, flags=re.S)
    return m.group(0) if m else None


def check() -> int:
    """Print, per documented command, what it would price and which rows are stale."""
    bad = 0
    for argv in REFRESH:
        missing, stale = needs(argv)
        if missing or stale:
            bad += 1
            print(" ".join(argv))
            for k in missing:
                print(f"  not committed: {k}")
            for k, why in stale.items():
                print(f"  stale: {k} ({', '.join(why)})")
    print(f"{len(REFRESH)} documented commands; {bad} need pricing (0: all from committed rows)")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["--refresh"], ["--refresh-stale"], ["--check"]):
        print(
            "usage: python -m nki_kernels.ledger.docs [--refresh | --refresh-stale | --check]",
            file=sys.stderr,
        )
        return 2
    if args == ["--check"]:
        return check()
    if args:
        refresh(stale_only=args == ["--refresh-stale"])
    page = PAGE.read_text()
    for name in LEDGERS:
        old = documented(page, name)
        if old is None:
            print(f"{PAGE}: no <!-- ledger-{name} --> markers", file=sys.stderr)
            return 1
        page = page.replace(old, block(name, render(name)))
    write_text_atomic(PAGE, page)
    print(f"{PAGE} rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
