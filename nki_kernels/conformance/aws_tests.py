"""nki-library's own test cases, run through the interpreter.

AWS's tests (`test/integration/nkilib/**/test_*.py` of an nki-library checkout) build
each case's inputs, call their harness (`UnitTestFramework`, `RangeTestHarness` or the
orchestrator directly), and hand one `KernelArgs` (kernel, LNC, inputs, golden outputs,
tolerances) to the `test_manager` fixture's `execute`. In their simulation mode that
runs the kernel on the CPU simulator. Here pytest collects the checkout's tests marked
`fast`, without AWS's conftest: the cases of `coverage_parametrize` sweeps and
`range_test_config` tests are generated as that conftest does, by the checkout's own
generators (`sweep_cases`), and a `test_manager` of ours runs each case through the
interpreter and compares with the case's own golden outputs and tolerances.
AWS's harness modules are imported unmodified; the third-party packages they import
only to talk to hosts, S3 or HTML reports (`fabric2`, `boto3`, `paramiko`, ...) get
inert stand-ins, and `neuron_dtypes` the loader's stand-in.

Each test module runs in its own subprocess with a time limit (`aws_runs`), so a case
too large for a CPU cannot stall the table; ids naming 4096+ sizes are skipped, as
AWS's CPU-simulation mode skips them (`LARGE_SHAPE_PATTERNS`, their list).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import re
import sys
import traceback
import types
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# ids AWS's simulation mode skips as too slow for a CPU (test/utils/simulation_setup.py)
LARGE_SHAPE_PATTERNS = ("4096", "5120", "8192", "16384", "32768", "36864")
# packages AWS's harness imports for remote hosts, uploads and reports
INERT = (
    "fabric2", "boto3", "botocore", "paramiko", "plotext", "pytest_html", "filelock",
    "aws_embedded_metrics", "attr",
)  # fmt: skip
TESTS = Path("test") / "integration"
MARK = "@@nki-kernels-case "  # prefixes the worker's result lines among pytest's output
MAX_CASES_ENV = "NKI_KERNELS_AWS_MAX_CASES"  # run only the first N unskipped cases per file
COLLECTED = "@@nki-kernels-collected "  # the worker's line naming every collected case
_NOTES: list[str] = []  # what the running case's comparisons did besides comparing


@dataclass
class CaseResult:
    """One AWS test case: pytest node id, status and the first line of the reason."""

    nodeid: str
    status: str  # pass | wrong | rejected | missing-API | error | skipped | timeout | no-fast
    detail: str = ""
    seconds: float = 0.0


class _Inert(types.ModuleType):
    """A module whose every attribute is an inert class (imports and decorators work)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {"__init__": lambda self, *a, **k: None})


class _InertFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name.split(".")[0] in INERT:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        return _Inert(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []  # type: ignore[attr-defined]


def _target(platform: Any) -> str:
    name = str(getattr(platform, "value", platform) or "trn2").lower()
    # trn3_a0: a trn3 stepping (AWS's Platforms enum); the interpreter models trn3
    return {"gen2": "trn1", "gen3": "trn2", "gen4": "trn3", "trn3_a0": "trn3"}.get(name, name)


def _compare(name: str, got: Any, want: Any, rtol: float, atol: float) -> None:
    """AWS's criterion (their validator's `maxAllClose`, "max" mode): an element matches
    when |got - want| <= atol + rtol * max|want|. Their own function is used when the
    checkout's comparators import."""
    import numpy as np

    if got is None:
        raise AssertionError(f"output {name!r}: the kernel returned nothing")
    from ..interp.dtypes import host_float32  # packed MX words compare as their values

    g, w = host_float32(got), host_float32(want, like=got)
    reshaped = ""
    if g.shape != w.shape:
        if g.size != w.size:
            raise AssertionError(f"output {name!r}: shape {g.shape}, golden {w.shape}")
        # AWS's validator reads every output back in its golden's shape
        # (test/utils/output_validator.py: np.fromfile(...).reshape(golden.shape)), so a
        # same-size output of another shape is compared there too, element by element in
        # row-major order
        reshaped = f"compared after reshape {g.shape} -> {w.shape}"
        _NOTES.append(f"output {name!r}: {reshaped}")
        g = g.reshape(w.shape)
    try:
        from test.integration.nkilib.utils.comparators import maxAllClose

        ok = bool(maxAllClose(g, w, rtol, atol, verbose=0))
    except ImportError:
        finite = np.abs(w[np.isfinite(w)])
        scale = float(finite.max()) if finite.size else 0.0
        ok = bool(np.all(np.abs(g.astype(np.float64) - w) <= atol + rtol * scale))
    if not ok:
        diff = np.abs(g.astype(np.float64) - w)
        err = float(np.nanmax(diff)) if diff.size else 0.0
        nan = int(np.count_nonzero(np.isnan(g) != np.isnan(w)))
        raise AssertionError(
            f"output {name!r}: outside rtol={rtol} x max|golden| + atol={atol} "
            f"(max |err| {err:.3g}, {nan} NaN mismatches)" + (f", {reshaped}" if reshaped else "")
        )


_KERNELS: dict[Any, Any] = {}  # AWS kernel function -> its interpreter Kernel


def interpreter_kernel(func: Any) -> Any:
    """The interpreter Kernel of AWS kernel function `func`, made once, so its language
    check runs once per file rather than once per case."""
    from . import loader

    kernel = _KERNELS.get(func)
    if kernel is None:
        kernel = _KERNELS[func] = loader.jit(func)
    return kernel


class InterpreterOrchestrator:
    """The `test_manager` AWS's tests call: `execute(kernel_args)` runs the kernel through
    the interpreter at the case's LNC and target and checks the golden outputs."""

    def execute(self, kernel_args: Any) -> None:
        """Run one AWS `KernelArgs` and raise AssertionError on a mismatch."""
        from ..interp.launch import run_call
        from . import aws_diagnose, aws_ranks

        if aws_ranks.collective_ranks(kernel_args) > 1:  # one launch per rank
            return aws_ranks.execute_ranks(kernel_args)
        compiler = kernel_args.compiler_input
        lnc = int(getattr(compiler, "logical_nc_config", 1) or 1)
        target = _target(getattr(compiler, "platform_target", None))
        inputs = kernel_args.kernel_input or {}
        if hasattr(inputs, "for_rank"):
            inputs = inputs.for_rank(0)
        inputs = {k.removesuffix(".must_alias_input"): v for k, v in inputs.items()}
        kernel = interpreter_kernel(kernel_args.kernel_func)
        launcher = kernel[lnc] if lnc > 1 else kernel
        val = kernel_args.validation_args
        pristine = _copy_inputs(inputs) if val is not None else None
        res = run_call(launcher, (), inputs, target=target)
        if val is None:
            return
        try:
            check_outputs(res.outputs, val, rank=0)
        except AssertionError as wrong:
            if pristine is None or not res.trace.count(opcode="quantize_mx"):
                raise
            found = aws_diagnose.mx_wrong_reason(launcher, pristine, target, val)
            if found is None:
                raise
            raise AssertionError(f"{found} ({wrong})") from wrong


def _copy_inputs(inputs: dict[str, Any]) -> dict[str, Any] | None:
    """Copies of a case's array inputs for a diagnostic re-run (the kernel writes its
    aliased outputs in place), or None above `aws_diagnose.COPY_LIMIT` bytes."""
    import numpy as np

    from .aws_diagnose import COPY_LIMIT

    arrays = [v for v in inputs.values() if isinstance(v, np.ndarray)]
    if sum(a.nbytes for a in arrays) > COPY_LIMIT:
        return None
    return {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in inputs.items()}


def check_outputs(out: Any, val: Any, rank: int) -> None:
    """Check a launch's outputs `out` against the golden values of `val` (AWS's
    `ValidationArgs`) for `rank`: a per-rank generator's `for_rank(rank)`, a lazy
    generator's golden (matched by its placeholders' names), or a plain dict."""
    outs = [] if out is None else list(out) if isinstance(out, (tuple, list)) else [out]
    golden_obj = val.golden_output
    names = None
    if hasattr(golden_obj, "for_rank"):
        golden = golden_obj.for_rank(rank)
    elif hasattr(golden_obj, "output_ndarray"):
        golden = golden_obj.golden
        # the placeholders name every output in return order; the golden may check some
        names = list(golden_obj.output_ndarray)
    else:
        golden = golden_obj
    if golden is None:
        return
    if names is not None and len(names) == len(outs) and set(golden) <= set(names):
        pairs = [(k, golden[k], outs[names.index(k)]) for k in golden]
    elif len(outs) != len(golden):
        raise AssertionError(f"kernel returned {len(outs)} outputs, golden has {len(golden)}")
    else:
        pairs = [(k, w, g) for (k, w), g in zip(golden.items(), outs)]
    for name, want, got in pairs:
        if hasattr(want, "validator"):  # CustomValidatorWithOutputTensorData
            if not want.validator().validate(got):
                raise AssertionError(f"output {name!r}: the case's custom validator failed")
            continue
        _compare(name, got, want, val.relative_accuracy, val.absolute_accuracy)


class _NoopCollector:
    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


class _Plugin:
    """pytest plugin: the fixtures AWS's tests request, the cases AWS's conftest would
    generate, and the outcome of each case."""

    def __init__(self, stream: bool = False) -> None:
        self.results: list[CaseResult] = []
        self.stream = stream

    def _emit(self, result: CaseResult) -> None:
        self.results.append(result)
        if self.stream:  # the parent keeps what finished if the file times out
            print(f"\n{MARK}{json.dumps(asdict(result))}", flush=True)

    def pytest_configure(self, config: Any) -> None:
        for m in ("fast", "simulation", "slow_simulation", "coverage_parametrize", "platforms"):
            config.addinivalue_line("markers", f"{m}: nki-library marker")

    def pytest_generate_tests(self, metafunc: Any) -> None:
        """The parametrization AWS's conftest gives `coverage_parametrize` sweeps and
        `range_test_config` tests, through the checkout's own generators."""
        sweep_cases(metafunc)

    def pytest_collection_modifyitems(self, config: Any, items: list[Any]) -> None:
        import pytest

        skip = pytest.mark.skip(reason="large shape (AWS's simulation mode skips it too)")
        for item in items:
            if item.get_closest_marker("slow_simulation") or any(
                p in item.name for p in LARGE_SHAPE_PATTERNS
            ):
                item.add_marker(skip)
        limit = int(os.environ.get(MAX_CASES_ENV, "0") or 0)
        if limit > 0:  # a quick look: the first `limit` cases that are not skipped
            kept = [item for item in items if not _skip_marked(item)][:limit]
            items[:] = kept

    def pytest_collection_finish(self, session: Any) -> None:
        if self.stream:  # the parent names each case a time-out leaves unrun
            ids = [item.nodeid for item in session.items if not _skip_marked(item)]
            print(f"\n{COLLECTED}{json.dumps(ids)}", flush=True)

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            self._emit(CaseResult(report.nodeid, "error", _collect_error(report)))

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when == "setup":
            _NOTES.clear()
        if report.when == "call" or (report.when == "setup" and not report.passed):
            self._emit(_classify(report, list(_NOTES)))


def _skip_marked(item: Any) -> bool:
    return any(m.name == "skip" for m in item.iter_markers())


def sweep_cases(metafunc: Any) -> None:
    """Parametrize one AWS test as AWS's conftest does: a `range_test_options` fixture
    from `RangeTestHarness` over the test's `range_test_config`, a `coverage_parametrize`
    marker from `generate_parametrized_test_case` (coverage "singles" unless the marker
    names one: the default of AWS's `--coverage` option). Both generators are the
    checkout's; Python's `random` is seeded (AWS's `NEURON_PYTHONHASHSEED`, default 0)
    so the generated ids are the same in every run."""
    import random

    seed = int(os.environ.get("NEURON_PYTHONHASHSEED", "0"))
    if "range_test_options" in metafunc.fixturenames:
        from test.utils import ranged_test_harness as rth

        config = getattr(metafunc.function, rth.RANGE_TEST_CONFIG_ATTR_KEY, None)
        if config is None:
            return
        extra = {}
        limit = getattr(metafunc.function, rth.RANGE_TEST_LIMIT_NUM_TESTS_ATTR_KEY, None)
        if limit is not None:
            extra[rth.RANGE_TEST_LIMIT_NUM_TESTS_ATTR_KEY] = limit
        random.seed(seed)
        ids, configs = rth.RangeTestHarness(config, **extra).get_unique_test_cases()
        metafunc.parametrize("range_test_options", configs, ids=ids)
        return
    marker = metafunc.definition.get_closest_marker("coverage_parametrize")
    if marker is None:
        return
    from test.utils import coverage_parametrized_tests as cpt

    params = dict(marker.kwargs)
    coverage = params.pop("coverage", None) or "singles"
    options = {
        "filter_func": params.pop("filter", None),
        "enable_automatic_boundary_tests": params.pop("enable_automatic_boundary_tests", True),
        "enable_invalid_combination_tests": params.pop("enable_invalid_combination_tests", True),
        "n_tests_per_boundary_value": params.pop("n_tests_per_boundary_value", 3),
        "max_invalid_tests": params.pop("max_invalid_tests", 30),
    }
    random.seed(seed)
    cases = cpt.generate_parametrized_test_case(params=params, coverage=coverage, **options)
    names, values, ids = cpt.extract_parametrize_args(params, cases)
    metafunc.parametrize(names, values, ids=ids)


def _collect_error(report: Any) -> str:
    """The error that stopped a file's collection, with the checkout file and line of a
    syntax error (nki-library's own `core/mlp/mlp.py` has one at d2ad3a57)."""
    exc = getattr(report.longrepr, "reprcrash", None)
    text = exc.message if exc is not None else str(report.longrepr)
    lines = [ln.strip().removeprefix("E").strip() for ln in text.splitlines() if ln.strip()]
    last = lines[-1] if lines else "collection failed"
    longrepr = str(report.longrepr)
    where = re.findall(r'File "([^"]+)", line (\d+)', longrepr)
    where = where or re.findall(r"(\S+\.py):(\d+): in ", longrepr)  # an ImportError's form
    if where and ("SyntaxError" in last or "IndentationError" in last):
        path = "/".join(Path(where[-1][0]).parts[-2:])
        last = f"{last} (syntax error in the checkout: {path}:{where[-1][1]})"
    elif where:  # e.g. a NameError in the test module itself (test_qkv_tkg at d2ad3a57)
        last = f"{last} [at {Path(where[-1][0]).name}:{where[-1][1]}]"
    return last[:300]


def _classify(report: Any, notes: list[str] | None = None) -> CaseResult:
    """The case's result from its pytest report; `notes` (e.g. an output compared after a
    reshape) become the reason of a pass."""
    secs = float(getattr(report, "duration", 0.0))
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        return CaseResult(report.nodeid, "skipped", reason.removeprefix("Skipped: "), secs)
    if report.passed:
        return CaseResult(report.nodeid, "pass", "; ".join(notes or []), secs)
    text = str(report.longrepr)
    exc = getattr(report.longrepr, "reprcrash", None)
    # an overflow's list of live tiles can be long: keep it, within reason
    msg = (exc.message if exc is not None else text).splitlines()[0][:1500]
    msg = msg.removeprefix("nki_kernels.interp.errors.")  # the class name is enough
    if "NotSupportedError" in msg or "not supported by the interpreter" in msg:
        status = "missing-API"
    elif "(rule " in msg:
        status = "rejected"
    elif msg.startswith(("AssertionError: output", "AssertionError: wrong")) or (
        "outputs, golden" in msg
    ):
        status = "wrong"
    else:
        status = "error"
    where = _kernel_line(report)
    return CaseResult(report.nodeid, status, msg + (f" [at {where}]" if where else ""), secs)


def _kernel_line(report: Any) -> str:
    """file:line of the innermost frame in the checkout's kernel sources (`nkilib_src`),
    else in its tests (an error of the test itself); `_where` put it on the report."""
    return str(getattr(report, "nki_where", ""))


def _where(tb: Any) -> str:
    frames = [(f.filename, f.lineno) for f in traceback.extract_tb(tb)]
    for part in ("nkilib_src", "/test/"):
        for filename, lineno in reversed(frames):
            if part in filename:
                return f"{Path(filename).name}:{lineno}"
    return ""


def platform_for(marker: Any, platforms: Any) -> Any:
    """The target a test runs at: trn2 unless its `platforms` marker excludes it, then
    trn3; None when it excludes both."""
    excluded = set(marker.kwargs.get("exclude") or []) if marker is not None else set()
    return next((t for t in (platforms.TRN2, platforms.TRN3) if t not in excluded), None)


def _fixtures() -> types.ModuleType:
    import pytest

    mod = types.ModuleType("nki_kernels_aws_fixtures")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(item: Any, call: Any) -> Any:
        outcome = yield
        if call.excinfo is not None:  # from the frames: cheaper than pytest's formatting
            outcome.get_result().nki_where = _where(call.excinfo.tb)

    @pytest.fixture
    def test_manager() -> InterpreterOrchestrator:
        return InterpreterOrchestrator()

    @pytest.fixture
    def collector() -> _NoopCollector:
        return _NoopCollector()

    @pytest.fixture
    def platform_target(request: Any) -> Any:
        """trn2, or trn3 for a test whose `platforms` marker excludes trn2 (AWS's conftest
        runs a session per target and deselects the tests that exclude it)."""
        from test.utils.common_dataclasses import Platforms  # the checkout's enum

        target = platform_for(request.node.get_closest_marker("platforms"), Platforms)
        if target is None:
            pytest.skip("the test runs on neither trn2 nor trn3 (its platforms marker)")
        return target

    mod.pytest_runtest_makereport = pytest_runtest_makereport  # type: ignore[attr-defined]
    mod.test_manager = test_manager  # type: ignore[attr-defined]
    mod.collector = collector  # type: ignore[attr-defined]
    mod.platform_target = platform_target  # type: ignore[attr-defined]
    return mod


def run_module(
    root: Path, module: Path, select: str | None = None, stream: bool = False
) -> list[CaseResult]:
    """Collect and run the `fast` cases of one AWS test file in this process (`stream`:
    print each result as a JSON line when it is known)."""
    import pytest

    from . import loader

    sys.meta_path.insert(0, _InertFinder())
    plugin = _Plugin(stream)
    args = [str(module), "-m", "fast", "--noconftest", "-q", "-p", "no:cacheprovider"]
    args += ["--rootdir", str(root), "-o", "addopts=", "-W", "ignore", "--tb=native"]
    if select:
        args += ["-k", select]
    with loader.checkout_context(root):
        loader._forget("test")  # the checkout's `test` package, not the standard library's
        import test.utils  # noqa: F401

        orch = types.ModuleType("test.utils.test_orchestrator")
        orch.Orchestrator = InterpreterOrchestrator  # type: ignore[attr-defined]
        sys.modules[orch.__name__] = orch  # the hardware orchestrator: replaced, not imported
        pytest.main(args, plugins=[plugin, _fixtures()])
    return plugin.results


def test_modules(root: Path) -> list[Path]:
    """The checkout's AWS test files (helpers and model-config tables excluded)."""
    base = Path(root) / TESTS
    return sorted(
        p
        for p in base.rglob("test_*.py")
        if not p.stem.endswith(("_common", "_utils", "_model_config", "_wrapper"))
    )


def main(argv: list[str]) -> int:
    """Worker entry: `python -m nki_kernels.conformance.aws_tests ROOT FILE [SELECT]`."""
    root, module = Path(argv[0]), Path(argv[1])
    results = run_module(root, module, argv[2] if len(argv) > 2 else None, stream=True)
    if not results:
        none = CaseResult(str(module), "no-fast", "the file marks no case `fast`")
        print(f"\n{MARK}{json.dumps(asdict(none))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
