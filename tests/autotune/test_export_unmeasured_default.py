"""A study whose heuristic default was never measured (tuning killed during trial 0, the
default's trial) exports valid JSON: default_latency_ns is null, and every reader of the
store takes it as "not measured" (issue 31). Storage passwords in the query string or
with an unescaped '/' are never printed."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from nki_kernels.autotune.cli import main
from nki_kernels.autotune.export import describe_entry, export_best
from nki_kernels.autotune.storage import StorageError, open_storage, redact, scrub
from nki_kernels.autotune.study import TuneOptions, Tuner
from nki_kernels.cli import main as cli_main
from nki_kernels.runtime.config_store import ConfigStore, problem_key
from nki_kernels.targets import TRN2

from .toy import ToyMeasurer, ToyProblem, make_toy

PROBLEM = ToyProblem(rows=256, cols=8200)
SECRET = "s3cr3t-Pw"


def _no_nan(token: str) -> None:
    raise AssertionError(f"invalid JSON constant {token}")


def test_an_unmeasured_default_is_exported_as_null_and_read_back(tmp_path, capsys) -> None:
    tuner = Tuner(
        make_toy(),
        PROBLEM,
        TRN2,
        storage=open_storage("memory"),
        measurer=ToyMeasurer(),
        options=TuneOptions(strategy="grid"),
    )
    tuner.run(n_trials=3)
    real_report = tuner.report

    def killed_during_trial_0():  # type: ignore[no-untyped-def]
        return dataclasses.replace(real_report(), heuristic=None)

    tuner.report = killed_during_trial_0  # type: ignore[method-assign]
    store = ConfigStore([tmp_path], tmp_path)
    with pytest.warns(UserWarning, match="recorded as null"):
        out = export_best(tuner, store)
    assert math.isnan(out.provenance.default_latency_ns) and math.isnan(out.speedup)
    data = json.loads(out.path.read_text(), parse_constant=_no_nan)  # strict JSON
    entry = data["entries"][problem_key(PROBLEM)]
    assert entry["provenance"]["default_latency_ns"] is None
    # the store reads it back (the entry is used) and the CLI lines show it
    decision = store.decide("toy_scale", TRN2, PROBLEM, kernel_hash=tuner.key.kernel_hash)
    assert decision.config == out.config and math.isnan(decision.provenance.default_latency_ns)
    assert "default        nan us" in describe_entry(entry)
    assert "nan" in decision.describe()
    assert cli_main(["configs", "show", "--config-dir", str(tmp_path)]) == 0
    assert "toy_scale" in capsys.readouterr().out


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://tuner@db.example/tune?password={SECRET}",
        f"postgresql://tuner@db.example/tune?sslmode=require&PASSWORD={SECRET}",
        f"postgresql://tuner:pa/{SECRET}@db.example/tune",
    ],
)
def test_storage_passwords_in_the_query_or_with_a_slash_are_redacted(url: str, capsys) -> None:
    assert SECRET not in redact(url) and "db.example" in redact(url)
    pw = f"pa/{SECRET}" if f"pa/{SECRET}" in url else SECRET
    assert SECRET not in scrub(f"FATAL: password {pw} rejected for {url}", url)
    bad_scheme = url.replace("postgresql", "postgresq", 1)
    assert main(["tune", "rms_norm", "--storage", bad_scheme, "--no-export"]) == 2
    assert SECRET not in capsys.readouterr().err
    with pytest.raises(StorageError) as e:
        open_storage(url.replace("db.example", "127.0.0.1:1"))
    assert SECRET not in str(e.value)
