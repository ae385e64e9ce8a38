"""`doctor` on the device path: the LNC the ops launch at and whether `nki_op` is there,
with and without the TorchNeuron test doubles."""

from __future__ import annotations

import pytest

from nki_kernels import cli
from nki_kernels.commands import doctor
from nki_kernels.runtime import lnc as runtime_lnc
from nki_kernels.testing import torch_neuronx_standin as standin


def test_without_torchneuron_lnc_1_and_no_nki_op(capsys: pytest.CaptureFixture[str]) -> None:
    runtime_lnc.set_runtime_lnc(None)
    report = doctor.collect()
    assert report.lnc == 1 and "no Neuron Runtime here" in report.lnc_source
    assert not report.nki_op and "not available" in report.nki_op_note
    assert cli.main(["doctor", "--require", "nki_op"]) == 1
    out = capsys.readouterr()
    assert "lnc" in out.out and "missing: nki_op" in out.err


@pytest.mark.parametrize("env", [None, 1])
def test_with_torchneuron_the_runtime_lnc_and_nki_op(neuron: str, env: int | None) -> None:
    with standin.real_device(lnc=env):
        report = doctor.collect()
        text = doctor.format_report(report)
    assert report.nki_op and report.satisfied("nki_op")
    if env is None:
        assert report.lnc == 2 and report.lnc_source.startswith("the trn2 default on a Neuron")
    else:
        assert report.lnc == 1 and report.lnc_source.startswith("NEURON_LOGICAL_NC_CONFIG=1;")
    assert "the default of every call, tune, configs which and estimate" in report.lnc_source
    assert f"lnc              {report.lnc} (" in text


def test_doctor_says_when_the_neuron_device_is_emulated(neuron: str) -> None:
    # the suite installs the emulated device (conftest): doctor names it as emulated
    report = doctor.collect()
    assert report.emulated_note.startswith("EMULATED")
    assert "emulated device  EMULATED" in doctor.format_report(report)


def test_parity_on_the_neuron_device_says_it_is_emulated(
    neuron: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from nki_kernels.parity import harness

    def stop(*args: object, **kwargs: object) -> None:
        raise ValueError("stopped before training")  # the device line is printed first

    monkeypatch.setattr(harness, "run_parity", stop)
    assert cli.main(["parity", "--device", "neuron", "--steps", "2"]) == 2
    assert "[parity] device neuron: EMULATED" in capsys.readouterr().out
