"""Report the environment nki-kernels runs in: package versions, which NKI backend the seam
uses, whether a Neuron device is visible, the default target, the LNC the ops launch at
and whether TorchNeuron's `nki_op` is available. With `--require`, exit
non-zero when something asked for is missing."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

NAME = "doctor"
HELP = "report packages, NKI backend, neuron device and default target"

# What `--require` can ask for, and what it means.
REQUIREMENTS = {
    "torch": "PyTorch is importable",
    "numpy": "NumPy is importable",
    "ml_dtypes": "ml_dtypes is importable",
    "nki": "the real Neuron `nki` package (not the PyPI placeholder) is importable",
    "neuronx-cc": "the Neuron compiler (module `neuronxcc`) is importable",
    "torch-neuronx": "TorchNeuron (module `torch_neuronx`) is importable",
    "neuron": "a `neuron` torch device is visible",
    "interpreter": "kernels run in the project's NKI interpreter",
    "nki_op": "TorchNeuron's `torch_neuronx.nki_op` is importable (ops traced by torch.compile)",
}


@dataclass
class Package:
    """One package: its distribution version (if installed) and whether it is usable."""

    name: str
    version: str | None
    usable: bool
    note: str = ""


@dataclass
class Report:
    """Everything `doctor` found."""

    python: str
    packages: dict[str, Package] = field(default_factory=dict)
    backend: str = ""
    backend_setting: str = ""
    neuron_devices: int = 0
    neuron_note: str = ""
    emulated_note: str = ""
    target: str = ""
    target_nc_version: int = 0
    target_source: str = ""
    lnc: int = 0
    lnc_source: str = ""
    nki_op: bool = False
    nki_op_note: str = ""

    def satisfied(self, requirement: str) -> bool:
        """Whether `requirement` (a key of REQUIREMENTS) holds."""
        if requirement == "neuron":
            return self.neuron_devices > 0
        if requirement == "interpreter":
            return self.backend == "interpreter"
        if requirement == "nki_op":
            return self.nki_op
        return self.packages[requirement].usable


def _dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _module_package(name: str, dist: str, module: str) -> Package:
    version = _dist_version(dist)
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if found:
        return Package(name, version, True)
    if version is not None:
        return Package(name, version, False, f"installed but module `{module}` is missing")
    return Package(name, None, False, "not installed")


def _nki_package(seam: Any) -> Package:
    version = _dist_version("nki")
    if seam._real_nki() is not None:
        return Package("nki", version, True, "Neuron NKI")
    if version is not None or importlib.util.find_spec("nki") is not None:
        return Package("nki", version, False, "PyPI placeholder, not the Neuron package")
    return Package("nki", None, False, "not installed")


def _neuron_devices() -> tuple[int, str]:
    import torch

    mod = getattr(torch, "neuron", None)
    if mod is None:
        return 0, "torch has no 'neuron' backend"
    if getattr(mod, "emulated", False):
        return 0, "only the emulated neuron device (host memory, nki_kernels.testing)"
    try:
        available = bool(mod.is_available()) if hasattr(mod, "is_available") else True
        count = int(mod.device_count()) if hasattr(mod, "device_count") else 0
    except Exception as exc:  # a half-installed backend must not crash the report
        return 0, f"torch.neuron failed: {exc}"
    if not available or count == 0:
        return 0, "torch has a 'neuron' backend but no device is visible"
    return count, f"{count} device(s)"


def _emulated() -> str:
    """Whether the emulated neuron device runs here, or could."""
    try:
        from ..testing import neuron_device
    except Exception as exc:  # torch too old for the Python PrivateUse1 backend
        return f"not available ({type(exc).__name__}: {exc})"
    if neuron_device.is_installed():
        return "EMULATED: `neuron` tensors live in host memory and the ops run in the interpreter"
    if neuron_device.real_neuron_backend_present():
        return "not used: a real neuron backend is present"
    return (
        "available: nki_kernels.testing.neuron_device.install() runs the neuron code path "
        "on CPU (host memory, interpreter)"
    )


def collect() -> Report:
    """Inspect the environment."""
    from .. import nki as seam
    from ..targets import DEFAULT_TARGET_NAME, TARGET_ENV_VAR, get_target

    report = Report(python=platform.python_version())
    for name, dist, module in (
        ("torch", "torch", "torch"),
        ("numpy", "numpy", "numpy"),
        ("ml_dtypes", "ml_dtypes", "ml_dtypes"),
    ):
        report.packages[name] = _module_package(name, dist, module)
    report.packages["nki"] = _nki_package(seam)
    report.packages["neuronx-cc"] = _module_package("neuronx-cc", "neuronx-cc", "neuronxcc")
    report.packages["torch-neuronx"] = _module_package(
        "torch-neuronx", "torch-neuronx", "torch_neuronx"
    )
    report.backend = seam.BACKEND
    setting = os.environ.get(seam.BACKEND_ENV_VAR)
    report.backend_setting = f"{seam.BACKEND_ENV_VAR}={setting}" if setting else "auto"
    report.neuron_devices, report.neuron_note = _neuron_devices()
    report.emulated_note = _emulated()
    try:
        target = get_target()
        report.target, report.target_nc_version = target.name, target.nc_version
        override = os.environ.get(TARGET_ENV_VAR)
        report.target_source = (
            f"{TARGET_ENV_VAR}={override}"
            if override
            else f"project default ({DEFAULT_TARGET_NAME})"
        )
    except ValueError as exc:
        report.target_source = str(exc)
    _lnc(report)
    _nki_op(report)
    return report


def _lnc(report: Report) -> None:
    from ..runtime import lnc
    from ..runtime.neuron_device import is_real_neuron

    try:
        configured = lnc.configured_lnc()
        report.lnc = lnc.runtime_lnc(report.target or None)
    except ValueError as exc:
        report.lnc_source = str(exc)
        return
    if configured is not None:
        why = f"{lnc.LNC_ENV_VAR}={configured}"
    elif is_real_neuron():
        why = f"the {report.target} default on a Neuron device"
    else:
        why = (
            f"no Neuron Runtime here; {lnc.LNC_ENV_VAR}=2 runs as a default "
            f"{report.target or 'trn2'} does"
        )
    report.lnc_source = f"{why}; the default of every call, tune, configs which and estimate"


def _nki_op(report: Report) -> None:
    from ..ops.registry import torchneuron_nki_op

    try:
        report.nki_op = torchneuron_nki_op() is not None
    except Exception as exc:  # a broken TorchNeuron install must not crash the report
        report.nki_op, report.nki_op_note = False, f"torch_neuronx failed to import: {exc}"
        return
    if report.nki_op:
        report.nki_op_note = "available: traceable ops are defined through it"
    elif report.packages["torch-neuronx"].usable:
        report.nki_op_note = "torch_neuronx has no nki_op: ops are plain custom ops"
    else:
        report.nki_op_note = "not available (TorchNeuron not installed): plain custom ops"


def format_report(report: Report) -> str:
    """The human-readable report."""
    from .. import __version__

    rows = [("nki-kernels", __version__), ("python", report.python)]
    for pkg in report.packages.values():
        text = pkg.version or "-"
        if pkg.note:
            text += f" ({pkg.note})"
        rows.append((pkg.name, text))
    rows.append(("backend", f"{report.backend} ({report.backend_setting})"))
    rows.append(("neuron device", report.neuron_note))
    rows.append(("emulated device", report.emulated_note))
    target = report.target or "invalid"
    rows.append(
        ("default target", f"{target} (NC-v{report.target_nc_version}; {report.target_source})")
    )
    rows.append(("lnc", f"{report.lnc or 'invalid'} ({report.lnc_source})"))
    rows.append(("nki_op", report.nki_op_note))
    width = max(len(k) for k, _ in rows) + 2
    return "\n".join(f"{k:<{width}}{v}" for k, v in rows)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `doctor`: --require WHAT (repeatable) and --json."""
    parser.add_argument(
        "--require",
        action="append",
        default=[],
        choices=sorted(REQUIREMENTS),
        metavar="WHAT",
        help="exit 1 unless WHAT is present (repeatable): " + ", ".join(sorted(REQUIREMENTS)),
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    """Print the report; exit 1 when a --require is not met."""
    report = collect()
    if args.json:
        print(json.dumps(asdict(report), indent=2))
    else:
        print(format_report(report))
    missing = [r for r in args.require if not report.satisfied(r)]
    for r in missing:
        print(f"missing: {r} -- {REQUIREMENTS[r]}", file=sys.stderr)
    return 1 if missing else 0
