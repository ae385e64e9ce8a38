"""The `nki-kernels` CLI: the dispatcher, `doctor` (report and --require) and `bench`."""

from __future__ import annotations

import importlib.machinery
import json
import subprocess
import sys
import types

import pytest
import torch

from nki_kernels import __version__, cli
from nki_kernels.commands import doctor


def _doctor(capsys, *argv):
    code = cli.main(["doctor", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def no_neuron(monkeypatch):
    """A torch without a `neuron` backend (the suite installs an emulated one)."""
    monkeypatch.delattr(torch, "neuron", raising=False)


def test_dispatcher_discovers_command_modules():
    found = cli.discover()
    assert {"doctor", "bench", "interp-bench"} <= set(found)
    for name, module in found.items():
        assert module.NAME == name and module.HELP
        assert callable(module.add_arguments) and callable(module.run)


def test_a_command_that_fails_to_import_does_not_break_the_others(monkeypatch, capsys):
    real_import = cli.importlib.import_module

    def flaky(name, *args):
        if name.endswith(".bench"):
            raise ImportError("no module named 'matplotlib'")
        return real_import(name, *args)

    monkeypatch.setattr(cli.importlib, "import_module", flaky)
    assert cli.main(["bench"]) == 1
    assert "unavailable" in capsys.readouterr().err
    assert cli.main(["doctor", "--require", "numpy"]) == 0


def test_version_and_help(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and __version__ in capsys.readouterr().out
    assert cli.main([]) == 2
    assert "doctor" in capsys.readouterr().out


def test_doctor_reports_versions_backend_device_and_target(capsys, no_neuron, monkeypatch):
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)
    code, out, _ = _doctor(capsys)
    assert code == 0
    lines = dict(line.split(None, 1) for line in out.splitlines() if not line.startswith(" "))
    assert lines["torch"].startswith(torch.__version__.split("+")[0])
    assert lines["numpy"][0].isdigit() and lines["ml_dtypes"][0].isdigit()
    assert "not installed" in lines["torch-neuronx"]
    assert lines["backend"].startswith("interpreter")
    assert "no 'neuron' backend" in out
    assert "trn2 (NC-v3; project default (trn2))" in out


def test_doctor_json_and_target_override(capsys, no_neuron, monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "gen4")
    monkeypatch.setenv("NKI_KERNELS_BACKEND", "interpreter")
    code, out, _ = _doctor(capsys, "--json")
    data = json.loads(out)
    assert code == 0
    assert data["target"] == "trn3" and data["target_nc_version"] == 4
    assert data["target_source"] == "NEURON_PLATFORM_TARGET_OVERRIDE=gen4"
    assert data["backend_setting"] == "NKI_KERNELS_BACKEND=interpreter"
    assert data["packages"]["torch"]["usable"] is True


def test_require_exits_non_zero_when_missing(capsys, no_neuron):
    code, _, err = _doctor(capsys, "--require", "torch", "--require", "interpreter")
    assert code == 0 and err == ""
    code, _, err = _doctor(capsys, "--require", "neuron", "--require", "torch-neuronx")
    assert code == 1
    assert "missing: neuron" in err and "missing: torch-neuronx" in err
    code, _, err = _doctor(capsys, "--require", "nki")
    assert code == 1 and "missing: nki" in err


def test_require_neuron_passes_with_a_visible_device(capsys, monkeypatch):
    fake = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 2)
    monkeypatch.setattr(torch, "neuron", fake, raising=False)
    code, out, _ = _doctor(capsys, "--require", "neuron")
    assert code == 0 and "2 device(s)" in out


def test_the_emulated_device_does_not_count(capsys, monkeypatch):
    fake = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 1, emulated=True)
    monkeypatch.setattr(torch, "neuron", fake, raising=False)
    code, out, _ = _doctor(capsys, "--require", "neuron")
    assert code == 1 and "emulated" in out


def test_require_torch_neuronx_passes_when_importable(capsys, monkeypatch, no_neuron):
    mod = types.ModuleType("torch_neuronx")
    mod.__spec__ = importlib.machinery.ModuleSpec("torch_neuronx", None)
    monkeypatch.setitem(sys.modules, "torch_neuronx", mod)
    code, _, err = _doctor(capsys, "--require", "torch-neuronx")
    assert code == 0, err


def test_placeholder_nki_is_reported_as_such(tmp_path, monkeypatch, capsys, no_neuron):
    (tmp_path / "nki").mkdir()
    (tmp_path / "nki" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "nki" or m.startswith("nki.")]:
        monkeypatch.delitem(sys.modules, name)
    report = doctor.collect()
    assert not report.packages["nki"].usable
    assert "placeholder" in report.packages["nki"].note
    sys.modules.pop("nki", None)


def test_unknown_requirement_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["doctor", "--require", "gpu"])
    assert e.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_interp_bench_repeats_must_be_positive(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["interp-bench", "--repeats", "0"])
    assert e.value.code == 2
    assert "--repeats: expected an integer >= 1; got '0'" in capsys.readouterr().err


def test_interp_bench_quick_prints_measured_figures(capsys):
    assert cli.main(["interp-bench", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "measured CPU times of the interpreter" in out
    assert "instructions/s measured" in out
    assert "numpy.matmul of the fp32-converted operands" in out and "ratio:" in out


def test_cli_runs_as_a_module():
    proc = subprocess.run(
        [sys.executable, "-m", "nki_kernels.cli", "doctor", "--require", "numpy"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "default target" in proc.stdout
