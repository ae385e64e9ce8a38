"""The measured wall-clock durations of the project's commands, and the text that states them.

benchmarks/data/durations.json holds, per command (`make test`, `make fuzz`,
`make bench`), the last measured run: seconds, date, the machine class it ran on, where
the figure comes from, and optionally the pytest summary. The README and the manual state
a command's duration only through `stated(command)` (build_readme.py substitutes it for
`<!-- duration: make test -->`), and tests/test_readme.py fails when a page states a
duration for one of these commands any other way, so a stated duration is always a
measured one with its date and machine.

Record a run (times the command, refuses a failing one, keeps pytest's summary line):

    python scripts/durations.py record make test
    python scripts/durations.py record make fuzz VENV=/path/to/.venv  # make variables pass

or a run timed elsewhere:

    python scripts/durations.py set "make test" --seconds 512 --source "CI log, run 1234"

then `python scripts/build_readme.py` and commit the three files.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data" / "durations.json"
COMMANDS = ("make test", "make fuzz", "make bench")
_SUMMARY = re.compile(r"=+ (.*\b(?:passed|failed)\b.*) in [\d.]+s(?: \([\d:]+\))? =+")


def mark(command: str) -> str:
    """The placeholder a page writes where `command`'s duration goes."""
    return f"<!-- duration: {command} -->"


def load(path: Path = DATA) -> dict[str, Any]:
    """The recorded durations, by command (a command never measured maps to None)."""
    data = json.loads(path.read_text()) if path.exists() else {}
    return {c: data.get(c) for c in COMMANDS}


def clock(seconds: float) -> str:
    """`seconds` as "8 min 32 s" (or "41 s")."""
    s = round(seconds)
    return f"{s // 60} min {s % 60} s" if s >= 60 else f"{s} s"


def stated(command: str, path: Path = DATA) -> str:
    """How the pages state `command`'s duration: the measured figure with its date,
    machine and source, or that it has not been measured."""
    entry = load(path)[command]
    if entry is None:
        return "not measured yet"
    text = f"{clock(entry['seconds'])}"
    if entry.get("with_install_seconds"):
        text += f" ({clock(entry['with_install_seconds'])} with the install)"
    if entry.get("summary"):
        text += f", {entry['summary']}"
    text += f"; measured {entry['date']} on {entry['machine']}"
    if entry.get("source"):
        text += f" ({entry['source']})"
    return text


def quick_start_text(path: Path = DATA) -> str:
    """The quick start's lines on how long the commands take."""
    return "\n".join(
        [
            "How long they take (wall clock, measured):",
            "",
            f"- `make bench`: {stated('make bench', path)};",
            f"- `make test`: {stated('make test', path)};",
            f"- `make fuzz` (the property-based suite at full size): {stated('make fuzz', path)}.",
        ]
    )


def machine() -> str:
    """This machine's class, as the durations name it."""
    return f"{os.cpu_count()} CPU cores, {platform.machine()}, {platform.system()}"


def write(command: str, entry: dict[str, Any], path: Path = DATA) -> None:
    """Store `entry` as `command`'s measured run."""
    if command not in COMMANDS:
        raise SystemExit(f"command: expected one of {', '.join(COMMANDS)}; got {command!r}")
    data = json.loads(path.read_text()) if path.exists() else {}
    data[command] = entry
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _record(argv: list[str]) -> int:
    command = " ".join(argv[:2])  # then make's VAR=value settings, e.g. VENV=/path/.venv
    if command not in COMMANDS or not all("=" in a for a in argv[2:]):
        raise SystemExit(f"command: expected one of {', '.join(COMMANDS)}; got {command!r}")
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    seconds = time.monotonic() - t0
    sys.stdout.write(proc.stdout[-3000:])
    if proc.returncode != 0:
        print(f"{command} failed (exit {proc.returncode}); nothing recorded", file=sys.stderr)
        return 1
    found = _SUMMARY.findall(proc.stdout)
    entry = {
        "seconds": round(seconds, 1),
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "source": "scripts/durations.py record",
    }
    if found:
        entry["summary"] = re.sub(r"\d{4,}", lambda m: f"{int(m.group()):,}", found[-1])
    write(command, entry)
    print(f"recorded {command}: {clock(seconds)} in {DATA}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    rec = sub.add_parser("record", help="run a command, time it, record it")
    rec.add_argument("argv", nargs="+", metavar="COMMAND")
    put = sub.add_parser("set", help="record a run timed elsewhere")
    put.add_argument("command", choices=COMMANDS)
    put.add_argument("--seconds", type=float, required=True)
    put.add_argument("--source", required=True, help="where the figure comes from")
    put.add_argument("--machine", default=machine())
    put.add_argument("--date", default=datetime.date.today().isoformat())
    put.add_argument("--summary", default="", help="e.g. '2469 passed'")
    args = parser.parse_args(argv)
    if args.verb == "record":
        return _record(args.argv)
    entry = {"seconds": args.seconds, "date": args.date, "machine": args.machine}
    entry["source"] = args.source
    if args.summary:
        entry["summary"] = args.summary
    write(args.command, entry)
    print(f"recorded {args.command}: {clock(args.seconds)} in {DATA}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
