"""Issue 16 findings through the CLI: explicit shapes and bucket policies (2, 3), configs
which (1), secrets (4), config files (5), lifecycle (6), one-line errors (7)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
import torch

import nki_kernels
from nki_kernels.autotune import lifecycle
from nki_kernels.autotune.buckets_cli import _price_sizes
from nki_kernels.autotune.buckets_opt import (
    MAX_CANDIDATES,
    LengthDistribution,
    linear_cost,
    optimize,
)
from nki_kernels.autotune.shapes import resolve_shape
from nki_kernels.autotune.storage import StorageError, normalize_url, open_storage, redact, scrub
from nki_kernels.autotune.study import CLAIM_SEP
from nki_kernels.cli import main
from nki_kernels.model_shapes import ATTENTION_SHAPES, MOE_SHAPES, NORM_SHAPES
from nki_kernels.runtime import buckets, lnc
from nki_kernels.runtime import config_store as cs

SECRET = "s3cr3t-pw"


@pytest.fixture(autouse=True)
def _clean_policies():
    buckets.reset_bucket_policies()
    yield
    buckets.reset_bucket_policies()


# -- finding 3: explicit dims ----------------------------------------------------------------
def test_explicit_shapes() -> None:
    assert resolve_shape(NORM_SHAPES, "hidden=5120").hidden == 5120
    moe = resolve_shape(MOE_SHAPES, "E=16,top_k=4,H=2048,I=1408")
    assert (moe.num_experts, moe.top_k, moe.hidden, moe.intermediate) == (16, 4, 2048, 1408)
    att = resolve_shape(ATTENTION_SHAPES, "head_dim=64,q_heads=32,kv_heads=8")
    assert (att.head_dim, att.num_heads, att.num_kv_heads) == (64, 32, 8)
    assert resolve_shape(ATTENTION_SHAPES, "llama3-70b,head_dim=64").num_heads == 64
    with pytest.raises(ValueError, match="lacks"):
        resolve_shape(MOE_SHAPES, "E=16")
    with pytest.raises(ValueError, match="unknown dimension 'width'"):
        resolve_shape(NORM_SHAPES, "width=3")


# -- findings 1, 2, 3: tune an arbitrary shape and policy, apply it, see it used -------------
def test_tune_any_shape_and_policy_then_configs_which_sees_it(tmp_path, capsys, monkeypatch):
    cfg, db = tmp_path / "configs", tmp_path / "s.db"
    monkeypatch.setattr(lnc, "_state", {"read": True, "value": None})  # no LNC set: 1 here
    base = ["tune", "rms_norm", "--shape", "hidden=5120", "--storage", str(db),
            "--config-dir", str(cfg), "--no-progress", "--trials", "3"]  # fmt: skip
    # a boundary the default policy lacks is an error, not a silent 2048
    assert main([*base, "--buckets", "1408"]) == 2
    err = capsys.readouterr().err
    assert "1408 is not a boundary" in err and "Traceback" not in err and err.count("\n") == 1
    assert main([*base, "--buckets", "384", "--bucket-policy", "explicit[384,1408]"]) == 0
    data = json.loads((cfg / "trn2" / "rms_norm.json").read_text())
    # tuned at the LNC the calls here launch at (1 without a device), which `configs which`
    # and the op itself also use: one default for every entry point
    key = "affine=w,dtype=bfloat16,hidden=5120,rows=384"
    assert list(data["entries"]) == [key]
    tuned = data["entries"][key]["config"]
    # apply it: the policy file the ops read, and the config directory
    policy = tmp_path / "policy.json"
    buckets.write_policy_file(policy, buckets.parse_policy("384,1408"), op="rms_norm")
    monkeypatch.setenv(buckets.POLICY_ENV_VAR, str(policy))
    monkeypatch.setenv(cs.CONFIG_DIR_ENV_VAR, str(cfg))
    monkeypatch.setattr(cs, "_default", None)
    buckets.reset_bucket_policies()
    capsys.readouterr()
    which = ["configs", "which", "rms_norm", "--shape", "hidden=5120", "--config-dir", str(cfg)]
    assert main([*which, "--size", "300"]) == 0
    out = capsys.readouterr().out
    assert "bucket 384" in out and "tuned entry" in out and "modeled" in out and "LNC 1" in out
    assert "why    your " in out and "wins" in out
    # and the op itself, called on 300 rows, pads to 384 and launches the tuned config
    x = torch.randn(300, 5120, dtype=torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        e = nki_kernels.explain("rms_norm", x, torch.ones(5120, dtype=torch.bfloat16), 1e-6)
    (d,) = e.decisions
    assert d.problem == key, d.problem
    assert d.source == cs.TUNED and d.entry_key == key and d.config.to_dict() == tuned
    # a shape with no entry of its own hidden size gets the heuristic default
    assert main(["configs", "which", "rms_norm", "--shape", "hidden=6144", "--size", "300",
                 "--config-dir", str(cfg)]) == 0  # fmt: skip
    assert "heuristic default" in capsys.readouterr().out


def test_buckets_writes_a_policy_and_coarsens_align_1(tmp_path, capsys) -> None:
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\n".join(str(n) for n in range(1, 4 * MAX_CANDIDATES, 3)) + "\n")
    policy = tmp_path / "p.json"
    argv = ["buckets", "--lengths", str(lengths), "--max-buckets", "8", "--align", "1",
            "--op", "rms_norm", "--cost", "linear", "--write-policy", str(policy)]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "coarsened to multiples of" in out
    settings = buckets.load_policy_file(policy)
    assert len(settings.for_op("rms_norm").boundaries) <= 8


def test_coarsened_optimum_is_no_worse_than_the_default() -> None:
    dist = LengthDistribution.from_samples(range(1, 9000))
    plan = optimize(dist, 16, linear_cost(), align=1)
    assert plan.note and len(plan.boundaries) <= 16


def test_model_pricing_sizes_and_unfit_sizes_are_skipped(monkeypatch, capsys) -> None:
    assert _price_sizes(1000) == [128, 256, 384, 512, 768, 1024]
    from argparse import Namespace

    from nki_kernels.autotune import buckets_cli
    from nki_kernels.autotune.measure import CostModelMeasurer
    from nki_kernels.kernel_config import InvalidConfig

    real = CostModelMeasurer.measure

    def measure(self, tunable, problem, config, target):  # type: ignore[no-untyped-def]
        if problem.rows >= 1024:
            raise InvalidConfig("does not fit (test)")
        return real(self, tunable, problem, config, target)

    monkeypatch.setattr(CostModelMeasurer, "measure", measure)
    args = Namespace(op="rms_norm", shape=None, dtype=None, target="trn2")
    cost, desc = buckets_cli._model_cost(args, 1000)
    err = capsys.readouterr().err
    assert "not priced" in err and "1024 (" in err and "at 5 sizes" in desc
    assert cost(1000) > cost(512) > 0


# -- finding 4: secrets ----------------------------------------------------------------------
def test_storage_urls_are_redacted_everywhere(capsys) -> None:
    url = f"postgresql://tuner:{SECRET}@db.example/tune"
    assert SECRET not in redact(url) and "db.example/tune" in redact(url)
    with pytest.raises(StorageError) as e:
        normalize_url(f"postgresq://tuner:{SECRET}@db/tune")
    assert SECRET not in str(e.value)
    with pytest.raises(StorageError, match="%40") as e:
        normalize_url("postgresql://tuner:pa@ss@db/tune")
    assert "pa@ss" not in str(e.value) and "ss@db" not in str(e.value)
    assert scrub(f"could not connect with {SECRET}", url) == "could not connect with ***"
    assert (
        main(["tune", "rms_norm", "--storage", f"postgresq://u:{SECRET}@h/d", "--no-export"]) == 2
    )
    err = capsys.readouterr().err
    assert SECRET not in err and "Traceback" not in err


def test_an_unreachable_database_is_one_line_without_the_password() -> None:
    with pytest.raises(StorageError) as e:
        open_storage(f"postgresql://tuner:{SECRET}@127.0.0.1:1/tune")
    assert SECRET not in str(e.value) and "cannot open" in str(e.value)


def test_workers_get_the_job_through_the_environment(monkeypatch) -> None:
    seen = {}

    class FakePopen:
        def __init__(self, cmd, **kw):  # type: ignore[no-untyped-def]
            seen["cmd"], seen["env"] = cmd, kw["env"]

    monkeypatch.setattr(lifecycle.subprocess, "Popen", FakePopen)
    lifecycle.spawn_worker({"storage": f"postgresql://u:{SECRET}@h/d"})
    assert not any(SECRET in a for a in seen["cmd"])
    assert SECRET in seen["env"][lifecycle.JOB_ENV_VAR]


# -- finding 5: configs show / validate on broken files -------------------------------------
def test_configs_show_and_validate_report_broken_files(tmp_path, capsys) -> None:
    d = tmp_path / "trn2"
    d.mkdir()
    (d / "rms_norm.json").write_text('{"format": 1, "entr')
    good = json.loads(
        (Path(buckets.__file__).parent.parent / "configs/trn2/rms_norm.json").read_text()
    )
    key = next(iter(good["entries"]))
    good["entries"][key]["config"]["chunk"] = "4096"
    (d / "add_rms_norm.json").write_text(json.dumps(good))
    assert main(["configs", "show", "--config-dir", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "not valid JSON" in captured.err and "INVALID" in captured.out
    assert main(["configs", "validate", "--config-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "config.chunk" in out and "problem(s)" in out
    assert main(["configs", "validate", "--config-dir", "shipped", "--op", "rms_norm"]) == 0


# -- finding 6: lifecycle -------------------------------------------------------------------
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_a_worker_dies_with_its_parent(tmp_path) -> None:
    pidfile = tmp_path / "child.pid"
    parent = textwrap.dedent(f"""
        import subprocess, sys, time
        from nki_kernels.autotune.lifecycle import _set_parent_death_signal
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                             preexec_fn=_set_parent_death_signal)
        open({str(pidfile)!r}, "w").write(str(p.pid))
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", parent])
    deadline = time.monotonic() + 60
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    child = int(pidfile.read_text())
    proc.kill()
    proc.wait()
    for _ in range(100):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the worker outlived its SIGKILLed parent")


def _tune_cmd(tmp_path: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "nki_kernels.cli", "tune", "rms_norm", "--buckets", "256",
            "--shape", "llama3-8b", "--storage", str(tmp_path / "s.db"), "--no-export",
            "--no-progress", *extra]  # fmt: skip


def test_sigint_ends_with_one_line_and_the_resume_command(tmp_path) -> None:
    proc = subprocess.Popen(_tune_cmd(tmp_path, "--trials", "400", "--strategy", "tpe"),
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    # wait until trials run (imports take long on a loaded machine), then interrupt
    from optuna.trial import TrialState as _State

    db = tmp_path / "s.db"
    deadline = time.monotonic() + 300
    while True:
        assert proc.poll() is None and time.monotonic() < deadline
        if db.exists():
            try:
                st = open_storage(str(db))
                done = sum(
                    len(st.get_all_trials(s._study_id, deepcopy=False, states=(_State.COMPLETE,)))
                    for s in st.get_all_studies()
                )
            except Exception:
                done = 0
            if done >= 2:
                break
        time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    (line,) = [x for x in err.splitlines() if x.startswith("tune: interrupted")]
    assert "resume with: nki-kernels tune rms_norm" in line
    storage = open_storage(str(tmp_path / "s.db"))
    from optuna.trial import TrialState

    # the interrupted run dropped its claims too: the dashboard sees the one study
    assert [s.study_name for s in storage.get_all_studies() if CLAIM_SEP in s.study_name] == []
    for s in storage.get_all_studies():
        trials = storage.get_all_trials(s._study_id, states=(TrialState.RUNNING,))
        assert trials == []


def test_reset_deletes_the_selected_study(tmp_path, capsys) -> None:
    db = str(tmp_path / "s.db")
    argv = ["tune", "rms_norm", "--buckets", "256", "--shape", "llama3-8b", "--storage", db,
            "--no-export", "--no-progress", "--trials", "2"]  # fmt: skip
    assert main(argv) == 0
    storage = open_storage(db)
    (study,) = storage.get_all_studies()  # claims dropped: one study per (op, target, bucket)
    assert main([*argv, "--regate"]) == 0
    assert main([*argv, "--reset"]) == 0
    assert "deleted " + study.study_name in capsys.readouterr().out
    assert open_storage(db).get_all_studies() == []
    assert main([*argv, "--reset", "no-such-study"]) == 2


# -- finding 7: one-line user errors --------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["tune", "no_such_op"], "op: expected one of"),
        (["tune", "rms_norm", "--target", "trn9", "--no-export"], "trn9"),
        (["tune", "rms_norm", "--shape", "hidden=x", "--no-export"], "hidden"),
        (["tune", "rms_norm", "--dtype", "int8", "--no-export"], "--dtype"),
    ],
)
def test_user_errors_are_one_line(argv, expect, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert expect in err and "Traceback" not in err and err.count("\n") == 1


@pytest.mark.parametrize("trials", ["0", "-3"])
def test_trials_must_be_at_least_one(trials, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["tune", "rms_norm", "--trials", trials])
    assert e.value.code == 2
    assert "--trials" in capsys.readouterr().err


# -- finding 7: what optuna-dashboard sees -------------------------------------------------
def test_the_dashboard_sees_one_study_per_bucket_with_parameters_as_values(tmp_path) -> None:
    import optuna

    db = tmp_path / "s.db"
    argv = ["tune", "rms_norm", "--buckets", "256,512", "--shape", "llama3-8b", "--storage",
            str(db), "--no-export", "--no-progress", "--trials", "4", "--strategy", "tpe",
            "--gate", "off"]  # fmt: skip
    assert main(argv) == 0
    # optuna's own storage API, as optuna-dashboard reads it
    summaries = optuna.get_all_study_summaries(storage=f"sqlite:///{db}")
    names = sorted(s.study_name for s in summaries)
    # (op, target, bucket, dtype) @ measurer : kernel hash -- and no claim markers
    assert [n.split("@")[0] for n in names] == [
        "rms_norm/trn2/rows256-h4096-w/bfloat16",
        "rms_norm/trn2/rows512-h4096-w/bfloat16",
    ], names
    for name in names:
        study = optuna.load_study(study_name=name, storage=f"sqlite:///{db}")
        trials = [t for t in study.trials if t.params]
        assert len(trials) >= 4
        for t in trials:
            # every parameter is the config field's value (chunk: 4096, not an index)
            config = json.loads(t.user_attrs["config"])
            assert t.params == {k: config[k] for k in t.params}, (t.params, config)
        assert "chunk" in trials[0].params
