"""nki-library's own test cases through the interpreter: the `test_manager` stand-in runs
an AWS `KernelArgs` and checks its golden outputs; on a real checkout (skipped without
/work/ext) AWS's cumsum tests are collected by pytest and pass."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from nki_kernels.conformance import aws_runs, aws_tests, loader
from nki_kernels.conformance.aws_tests import CaseResult, InterpreterOrchestrator

HERE = Path(__file__).parent
FAKE_LIB = HERE / "fake_checkout"
REAL_LIB = Path("/work/ext/aws-neuron+nki-library")


def _kernel_args(golden, lnc=1, rtol=1e-5, atol=1e-6):
    scale = loader.load_kernel(FAKE_LIB, "nkilib.core.scale.scale", "scale")
    params = loader.load_kernel(FAKE_LIB, "nkilib.core.scale.scale", "ScaleParams")()
    x = np.arange(130 * 8, dtype=np.float32).reshape(130, 8) / 100
    return SimpleNamespace(
        kernel_func=scale,
        compiler_input=SimpleNamespace(logical_nc_config=lnc, platform_target="trn2"),
        kernel_input={"x": x, "params": params},
        validation_args=SimpleNamespace(
            golden_output=golden(x), relative_accuracy=rtol, absolute_accuracy=atol
        ),
    )


def test_the_orchestrator_runs_the_case_and_accepts_its_golden():
    with loader.checkout_context(FAKE_LIB):
        InterpreterOrchestrator().execute(_kernel_args(lambda x: {"out": x * 2.0}))


def test_a_wrong_golden_fails_with_the_tolerance_and_error():
    with loader.checkout_context(FAKE_LIB), pytest.raises(AssertionError) as e:
        InterpreterOrchestrator().execute(_kernel_args(lambda x: {"out": x * 2.0 + 0.5}))
    assert "outside rtol=1e-05 x max|golden| + atol=1e-06" in str(e.value)
    assert "max |err| 0.5, 0 NaN mismatches" in str(e.value)


def test_the_tolerance_is_relative_to_the_largest_golden_value():
    """AWS's criterion: |got - want| <= atol + rtol * max|want| (not per element)."""

    def golden(x):  # off by 1e-4 * max everywhere: fine for rtol 2e-4 of the maximum
        return {"out": x * 2.0 + float(np.abs(x * 2.0).max()) * 1e-4}

    with loader.checkout_context(FAKE_LIB):
        InterpreterOrchestrator().execute(_kernel_args(golden, rtol=2e-4))


def test_a_lazy_golden_is_computed_and_a_count_mismatch_named():
    lazy = lambda x: SimpleNamespace(output_ndarray={"a": x, "b": x}, golden={"a": x, "b": x})  # noqa: E731
    with loader.checkout_context(FAKE_LIB), pytest.raises(AssertionError) as e:
        InterpreterOrchestrator().execute(_kernel_args(lazy))
    assert "kernel returned 1 outputs, golden has 2" in str(e.value)


def test_a_same_size_output_of_another_shape_is_compared_as_awss_validator_reads_it():
    """AWS's validator reads an output back in its golden's shape, so a [130, 8] output
    against a [8, 130] golden of the same elements is compared -- and the pass says so."""
    aws_tests._NOTES.clear()
    with loader.checkout_context(FAKE_LIB):
        InterpreterOrchestrator().execute(
            _kernel_args(lambda x: {"out": (x * 2.0).reshape(8, 130)})
        )
    note = "output 'out': compared after reshape (130, 8) -> (8, 130)"
    assert aws_tests._NOTES == [note]
    report = SimpleNamespace(nodeid="t", skipped=False, passed=True, duration=0.0)
    assert aws_tests._classify(report, aws_tests._NOTES) == CaseResult("t", "pass", note)
    golden = lambda x: {"out": (x * 2.0 + 0.5).reshape(8, 130)}  # noqa: E731
    with loader.checkout_context(FAKE_LIB), pytest.raises(AssertionError) as e:
        InterpreterOrchestrator().execute(_kernel_args(golden))
    assert str(e.value).endswith("NaN mismatches), compared after reshape (130, 8) -> (8, 130)")
    with loader.checkout_context(FAKE_LIB), pytest.raises(AssertionError) as e:
        InterpreterOrchestrator().execute(_kernel_args(lambda x: {"out": x[:, :4]}))
    assert str(e.value) == "output 'out': shape (130, 8), golden (130, 4)"


def test_table_counts_every_status():
    rs = [
        CaseResult("test/integration/a.py::t[1]", "pass"),
        CaseResult("test/integration/a.py::t[2]", "rejected", "rule X | y"),
        CaseResult("test/integration/a.py::t[3]", "skipped", "large shape"),
    ]
    text = aws_runs.table(rs)
    assert "| `a.py::t[2]` | rejected | rule X \\| y |" in text
    assert text.endswith("1 of 2 cases run pass (pass 1, rejected 1, skipped 1).")


def _run(rel, statuses, checkout="c0", interp="v0", timeout_s=60.0):
    results = [CaseResult(f"{rel}::t[{i}]", st) for i, st in enumerate(statuses)]
    return aws_runs.FileRun(rel, checkout, interp, "p", None, timeout_s, "t", 1.0, 0.5, results)


def test_file_table_counts_per_file_and_totals_the_cases_not_skipped():
    runs = [
        _run("test/integration/nkilib/core/a/test_a.py", ["pass", "pass", "skipped", "timeout"]),
        _run("test/integration/nkilib/core/b/test_b.py", ["wrong", "pass"]),
        _run("test/integration/nkilib/x/test_none.py", ["no-fast"]),
    ]
    runs[1].results[0].detail = "output 'o': off | far"
    text = aws_runs.file_table(runs)
    assert "| `core/a/test_a.py` | 2 | 0 | 0 | 0 | 0 | 1 | 1 |" in text
    assert "| `core/b/test_b.py` | 1 | 1 | 0 | 0 | 0 | 0 | 0 | output 'o': off / far |" in text
    assert "3 of the 5 cases not skipped pass (60.0 %)" in text
    assert "Files that mark no case `fast`: `x/test_none.py`." in text
    where = "nki-library at c0, this repository at p (interpreter versions v0), 60 s per file"
    assert where in text


def test_pre_05_matches_stay_wrong_and_get_a_second_labelled_figure():
    runs = [_run("test/integration/nkilib/core/m/test_m.py", ["wrong", "wrong", "pass"])]
    runs[0].results[0].detail = "wrong under NKI 0.6; matches the pre-0.5 scale (output ...)"
    text = aws_runs.file_table(runs)
    assert "1 of the 3 cases not skipped pass (33.3 %)" in text
    assert "Not counted as passes: 1 of the wrong cases match" in text
    assert "counting them would give 2 of 3 (66.7 %)" in text


def test_the_cache_round_trips_and_is_fresh_only_for_the_same_commit_and_version(tmp_path):
    run = _run("test/integration/nkilib/core/a/test_a.py", ["pass", "timeout"])
    aws_runs._save(tmp_path, run)
    (back,) = aws_runs.load_cache(tmp_path)
    assert back == run
    assert aws_runs._fresh(back, "c0", "v0", None, 60.0)
    assert not aws_runs._fresh(back, "c1", "v0", None, 60.0)  # another checkout commit
    assert not aws_runs._fresh(back, "c0", "v1", None, 60.0)  # another interpreter
    assert not aws_runs._fresh(back, "c0", "v0", "cumsum", 60.0)  # another -k
    assert not aws_runs._fresh(back, "c0", "v0", None, 900.0)  # a time-out, longer limit now


def test_run_files_skips_fresh_cached_files_unless_rerun(tmp_path, monkeypatch):
    root = tmp_path / "lib"
    mod = root / "test/integration/nkilib/core/a/test_a.py"
    mod.parent.mkdir(parents=True)
    mod.write_text("")
    calls = []

    def fake_run_file(root_, mod_, timeout_s, select=None, max_cases=None):
        calls.append(mod_)
        rel = str(mod_.relative_to(root_))
        return _run(rel, ["pass"], aws_runs.git_commit(root_), aws_runs.interpreter_version())

    monkeypatch.setattr(aws_runs, "run_file", fake_run_file)
    cache = tmp_path / "cache"
    first = aws_runs.run_files(root, [mod], cache_dir=cache, jobs=2)
    again = aws_runs.run_files(root, [mod], cache_dir=cache)
    assert len(calls) == 1 and again == first
    aws_runs.run_files(root, [mod], cache_dir=cache, rerun=True)
    assert len(calls) == 2


@pytest.mark.skipif(not REAL_LIB.exists(), reason="needs the nki-library checkout")
def test_aws_cumsum_fast_cases_pass_against_their_golden(tmp_path):
    mod = REAL_LIB / "test/integration/nkilib/core/cumsum/test_cumsum.py"
    (run,) = aws_runs.run_files(REAL_LIB, [mod], timeout_s=300, cache_dir=tmp_path)
    assert len(run.results) == 3 and {r.status for r in run.results} == {"pass"}, run.results
    assert run.checkout.startswith("d2ad3a57") or run.checkout


@pytest.mark.skipif(not REAL_LIB.exists(), reason="needs the nki-library checkout")
def test_a_coverage_sweep_is_generated_by_the_checkouts_own_generator(tmp_path):
    """test_rope's fast test is a `coverage_parametrize` sweep (AWS's conftest expands it)."""
    mod = REAL_LIB / "test/integration/nkilib/core/embeddings/test_rope.py"
    run = aws_runs.run_file(REAL_LIB, mod, timeout_s=300)
    assert run.results and {r.status for r in run.results} == {"pass"}, run.results
    assert all("test_rope_fast[" in r.nodeid for r in run.results)


@pytest.mark.skipif(not REAL_LIB.exists(), reason="needs the nki-library checkout")
def test_a_checkout_syntax_error_is_named_with_its_file_and_line():
    mod = REAL_LIB / "test/integration/nkilib/core/mlp/test_mlp_cte.py"
    (res,) = aws_runs.run_file(REAL_LIB, mod, timeout_s=300).results
    assert res.status == "error"
    assert res.detail.endswith("(syntax error in the checkout: mlp/mlp.py:203)"), res.detail


def test_a_test_that_excludes_trn2_runs_at_trn3_as_awss_per_target_sessions_do():
    import enum

    class Platforms(enum.Enum):
        TRN1, TRN2, TRN3 = "trn1", "trn2", "trn3"

    def marker(*excluded):
        return SimpleNamespace(kwargs={"exclude": list(excluded)})

    assert aws_tests.platform_for(None, Platforms) is Platforms.TRN2
    assert aws_tests.platform_for(marker(Platforms.TRN3), Platforms) is Platforms.TRN2
    assert (
        aws_tests.platform_for(marker(Platforms.TRN1, Platforms.TRN2), Platforms) is Platforms.TRN3
    )
    assert aws_tests.platform_for(marker(Platforms.TRN2, Platforms.TRN3), Platforms) is None


@pytest.mark.skipif(not REAL_LIB.exists(), reason="needs the nki-library checkout")
def test_an_error_in_awss_own_test_code_names_its_line():
    """gen_mask_tkg's output descriptor looks up 'mask_out_hbm', but its inputs name the
    key 'mask_out_hbm.must_alias_input' (the checkout's test, before any kernel runs)."""
    mod = REAL_LIB / "test/integration/nkilib/core/attention/test_gen_mask_tkg.py"
    run = aws_runs.run_file(REAL_LIB, mod, 300, "test_flat_kv_strided and b-4_qh-1_sc-256")
    (res,) = run.results
    assert res.status == "error"
    assert res.detail == "KeyError: 'mask_out_hbm' [at test_gen_mask_tkg.py:422]", res.detail


def _worker_stdout(collected: list[str], done: list[CaseResult]) -> str:
    lines = ["noise", f"{aws_tests.COLLECTED}{json.dumps(collected)}"]
    lines += [f"{aws_tests.MARK}{json.dumps(asdict(r))}" for r in done]
    return "\n".join(lines)


def test_a_killed_worker_names_the_case_it_ran_and_the_cases_it_never_reached():
    ids = ["f.py::t[a]", "f.py::t[b]", "f.py::t[c]"]
    out = _worker_stdout(ids, [CaseResult(ids[0], "pass")])
    results = aws_runs.worker_results("f.py", out, "", -9, 600.0)
    assert [(r.nodeid, r.status) for r in results] == [
        (i, s) for i, s in zip(ids, ["pass", "error", "error"])
    ]
    assert results[1].detail == (
        "the worker was killed by SIGKILL (the out-of-memory killer's signal) while this case ran"
    )
    assert results[2].detail.startswith("not reached: the worker was killed by SIGKILL")
    crashed = aws_runs.worker_results("f.py", out, "", 3, 600.0)
    assert crashed[1].detail == "the worker exited with status 3 while this case ran"


def test_a_worker_stopped_at_the_limit_reports_time_outs_and_a_complete_one_only_results():
    ids = ["f.py::t[a]", "f.py::t[b]"]
    out = _worker_stdout(ids, [CaseResult(ids[0], "wrong", "off")])
    stopped = aws_runs.worker_results("f.py", out, "", None, 60.0)
    assert [r.status for r in stopped] == ["wrong", "timeout"]
    assert stopped[1].detail == "not reached in 60 s (the file's limit)"
    full = _worker_stdout(ids, [CaseResult(ids[0], "pass"), CaseResult(ids[1], "pass")])
    assert [r.status for r in aws_runs.worker_results("f.py", full, "", 0, 60.0)] == ["pass"] * 2


def test_a_run_is_stamped_with_the_interpreter_version_it_started_with(monkeypatch, tmp_path):
    sources = {"version": "before"}
    monkeypatch.setattr(aws_runs, "interpreter_version", lambda: sources["version"])
    mod = tmp_path / "test_x.py"
    mod.write_text("")

    def fake_run(cmd, **kwargs):
        if "nki_kernels.conformance.aws_tests" in cmd:
            sources["version"] = "after"  # the sources change while the worker runs
        return SimpleNamespace(stdout="", stderr="", returncode=0)

    monkeypatch.setattr(aws_runs.subprocess, "run", fake_run)
    run = aws_runs.run_file(tmp_path, mod, 10.0)
    assert sources["version"] == "after" and run.interpreter == "before"
