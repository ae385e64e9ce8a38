"""Run the kernels of a local AWS checkout against their own references; tabulate.

A `Case` names a kernel of the checkout (module and attribute), builds its inputs at a
small shape, and names the reference to compare with -- the checkout's own (`*_torch.py`
of nki-library, the NumPy reference an SDK example ships) whenever it has one. The
runner imports the kernel unmodified (`loader`), runs it in the interpreter and sorts
the outcome into:

- `pass`: the outputs match the reference (or the case expects a rejection, as the SDK's
  deliberately broken layout example does, and gets that rule);
- `wrong`: it ran, but the outputs differ (the largest error is reported);
- `rejected`: the interpreter refused the kernel with a rule (`rule X: ...`);
- `missing-API`: a documented NKI name the interpreter does not implement;
- `error`: anything else -- an import failure (a module the checkout needs, a syntax
  error in the checkout itself) or a Python error inside the kernel.
"""

from __future__ import annotations

import inspect
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..interp.errors import NkiValidationError, NotSupportedError
from ..interp.launch import run_call
from . import loader

STATUSES = ("pass", "wrong", "rejected", "missing-API", "error")


@dataclass(frozen=True)
class Case:
    """One run of one kernel of a checkout.

    `build(rng)` (or `build(rng, ctx)`, for inputs that need the checkout's own types)
    returns the kernel's positional and keyword arguments (NumPy arrays and Python
    values); `reference(ctx, args, kwargs)` returns the expected outputs (an array or a
    tuple of arrays), `ctx` giving access to the checkout (`ctx.load(module, attr)`).
    `select(outputs)` picks the compared outputs (default: all). `expect_rule` marks a
    case whose correct outcome is a rejection with that rule. `wrap(fn)` turns a
    subkernel whose operands live in SBUF into a kernel with HBM inputs and outputs.
    """

    kernel: str
    name: str
    module: str
    attr: str
    build: Callable[..., tuple[tuple[Any, ...], dict[str, Any]]]
    reference: Callable[..., Any] | None = None
    lnc: int = 1
    rtol: float = 1e-2
    atol: float = 1e-2
    jit: bool = False  # wrap a plain function in nki.jit, as the checkout's tests do
    select: Callable[[Any], Any] | None = None
    expect_rule: str | None = None
    source: str = ""  # where the reference comes from, for the table's notes
    wrap: Callable[[Any], Callable[..., Any]] | None = None  # subkernel -> a kernel of ours


@dataclass
class Outcome:
    """What one case gave."""

    kernel: str
    case: str
    status: str
    detail: str = ""
    seconds: float = 0.0
    instructions: int = 0


@dataclass
class Context:
    """The checkout a case runs against (passed to `Case.reference`)."""

    root: Path
    modules: dict[str, Any] = field(default_factory=dict)

    def load(self, module: str, attr: str) -> Any:
        """An attribute of a checkout module (imported unmodified)."""
        return loader.load_kernel(self.root, module, attr)


def _short(e: BaseException, limit: int = 160) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def classify(e: BaseException) -> tuple[str, str]:
    """(status, detail) of an exception raised while importing or running a case."""
    if isinstance(e, NotSupportedError):
        return "missing-API", _short(e)
    if isinstance(e, NkiValidationError):
        return "rejected", f"rule {e.rule}: {_short(e)}"
    if isinstance(e, SyntaxError):
        where = "/".join(Path(e.filename or "?").parts[-2:])
        return "error", f"syntax error in the checkout: {where}:{e.lineno}"
    if isinstance(e, ModuleNotFoundError):
        extra = (
            " (pip install 'nki-kernels[conformance]')" if e.name in ("scipy", "allpairspy") else ""
        )
        return "error", f"import: no module named {e.name!r}{extra}"
    frame = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    where = f" at {Path(frame.filename).name}:{frame.lineno}" if frame else ""
    return "error", f"{type(e).__name__}{where}: {_short(e)}"


def _as_tuple(x: Any) -> tuple[Any, ...]:
    if isinstance(x, dict):
        return tuple(x.values())
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _to_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x).astype(np.float64)


def compare(got: Any, want: Any, rtol: float, atol: float) -> tuple[bool, str]:
    """Whether every output matches its reference (allclose), and the largest error."""
    g, w = _as_tuple(got), _as_tuple(want)
    if len(g) != len(w):
        return False, f"{len(g)} outputs, reference has {len(w)}"
    worst = 0.0
    for a, b in zip(g, w, strict=True):
        a, b = _to_numpy(a), _to_numpy(b)
        if a.shape != b.shape:
            if a.size != b.size:
                return False, f"output shape {a.shape}, reference {b.shape}"
            a = a.reshape(b.shape)
        nan = np.isnan(a) != np.isnan(b)
        if nan.any():
            return False, f"{int(nan.sum())} NaN mismatches (unwritten output?)"
        err = np.abs(a - b)
        worst = max(worst, float(np.nanmax(err)) if err.size else 0.0)
        if not np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
            bad = float(np.mean(~np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)))
            return False, f"max |err| {worst:.3g}, {bad:.1%} of elements outside tolerance"
    return True, f"max |err| {worst:.3g}"


def run_case(root: str | Path, case: Case, seed: int = 0) -> Outcome:
    """Import, run and check one case."""
    ctx = Context(Path(root))
    t0 = time.perf_counter()
    out = Outcome(case.kernel, case.name, "error")
    try:
        fn = loader.load_kernel(root, case.module, case.attr)
        if case.wrap is not None:  # a subkernel (SBUF operands): call it from a kernel of ours
            fn = case.wrap(fn)
        kernel: Any = loader.jit(fn) if case.jit or case.wrap is not None else fn
        rng = np.random.default_rng(seed)
        wants_ctx = len(inspect.signature(case.build).parameters) > 1
        args, kwargs = case.build(rng, ctx) if wants_ctx else case.build(rng)
        with loader.checkout_context(root):
            launch = kernel[case.lnc] if case.lnc != 1 else kernel
            res = run_call(launch, tuple(args), dict(kwargs))
            got = res.outputs if case.select is None else case.select(res.outputs)
            out.instructions = len(res.trace.instrs)
            if case.expect_rule is not None:
                out.status, out.detail = "wrong", f"ran, but rule {case.expect_rule} expected"
            elif case.reference is None:
                out.status, out.detail = "error", "case has no reference"
            else:
                want = case.reference(ctx, args, kwargs)
                ok, detail = compare(got, want, case.rtol, case.atol)
                out.status, out.detail = ("pass" if ok else "wrong"), detail
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):
            raise
        if case.expect_rule is not None and getattr(e, "rule", None) == case.expect_rule:
            out.status, out.detail = "pass", f"rejected as the source expects: {_short(e)}"
        else:
            out.status, out.detail = classify(e)
    out.seconds = time.perf_counter() - t0
    return out


def run_cases(root: str | Path, cases: list[Case], seed: int = 0) -> list[Outcome]:
    """Run every case against the checkout at `root`."""
    return [run_case(root, c, seed) for c in cases]


def table(outcomes: list[Outcome]) -> str:
    """A Markdown table of the outcomes, with a pass count."""
    rows = ["| kernel | case | result | detail |", "|---|---|---|---|"]
    for o in outcomes:
        detail = o.detail.replace("|", "\\|")
        rows.append(f"| `{o.kernel}` | {o.case} | {o.status} | {detail} |")
    n = len(outcomes)
    passed = sum(o.status == "pass" for o in outcomes)
    counts = ", ".join(
        f"{s} {sum(o.status == s for o in outcomes)}"
        for s in STATUSES
        if any(o.status == s for o in outcomes)
    )
    rows.append("")
    rows.append(f"{passed} of {n} cases pass ({counts}).")
    rows += next_steps({o.status for o in outcomes})
    return "\n".join(rows)


# what to do about each kind of failure (the manual's pages named are in docs/MANUAL.md)
NEXT_STEPS = {
    "wrong": "wrong: the kernel ran but its output differs from the checkout's reference. "
    "Rerun the case alone (--kernel NAME) and compare the outputs; if AWS's kernel is right "
    "on hardware, an instruction's semantics in the interpreter are wrong (see 'Known "
    "differences from hardware' in the manual's interpreter page).",
    "rejected": "rejected: the interpreter refused the kernel with the rule named (each rule "
    "and its source: 'Rules enforced' in the manual's interpreter page). Fix the line it "
    "names, or, if the compiler and the chip accept it, report the rule with the case.",
    "missing-API": "missing-API: a documented NKI name the interpreter does not implement "
    "yet; the supported names are listed under 'What is supported' in the manual's "
    "interpreter page. Skip the case (--kernel) or add the name to nki_kernels/interp.",
    "error": "error: an import or Python error in the checkout: check that it is the "
    "nki-library / aws-neuron-sdk layout this command expects (a clean checkout, no "
    "local edits) and that the conformance extra is installed.",
}


def next_steps(statuses: set[str]) -> list[str]:
    """Lines saying what to do about each failure kind present (none when all pass)."""
    present = [s for s in STATUSES if s in statuses and s in NEXT_STEPS]
    return ["", "What to do:", *[f"- {NEXT_STEPS[s]}" for s in present]] if present else []


def import_outcomes(root: str | Path) -> list[Outcome]:
    """Try to import every kernel module of the checkout (unmodified)."""
    out = []
    for name in loader.module_names(root):
        try:
            loader.load_module(root, name)
            out.append(Outcome(name, "import", "pass"))
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt):
                raise
            status, detail = classify(e)
            out.append(Outcome(name, "import", status, detail))
    return out


def import_table(root: str | Path) -> str:
    """A Markdown table of the modules that fail to import, with the count that do."""
    outs = import_outcomes(root)
    ok = sum(o.status == "pass" for o in outs)
    rows = ["| module | result | detail |", "|---|---|---|"]
    rows += [f"| `{o.kernel}` | {o.status} | {o.detail} |" for o in outs if o.status != "pass"]
    rows.append("")
    rows.append(f"{ok} of {len(outs)} kernel modules import.")
    rows += next_steps({o.status for o in outs})
    return "\n".join(rows)
