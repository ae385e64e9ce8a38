"""The seam `nki_kernels.nki`: the real Neuron `nki` only when it is genuinely there (never
the empty PyPI placeholder), the interpreter otherwise or when forced."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

import nki_kernels.interp as interp
from nki_kernels import nki as seam

GENUINE = {
    "__init__.py": "def jit(fn=None, **kw):\n    return fn\n",
    "language/__init__.py": "def ndarray(shape, dtype, buffer=None):\n    return None\n",
    "isa/__init__.py": "def nc_matmul(dst, stationary, moving, **kw):\n    return None\n",
}


@pytest.fixture
def fake_nki(tmp_path, monkeypatch):
    """Install a package named `nki` (files given as {relative path: source}) on sys.path."""

    def install(files: dict[str, str]) -> Path:
        root = tmp_path / "site"
        for rel, src in files.items():
            path = root / "nki" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(src))
        monkeypatch.syspath_prepend(str(root))
        return root

    for name in [m for m in sys.modules if m == "nki" or m.startswith("nki.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delenv(seam.BACKEND_ENV_VAR, raising=False)
    yield install
    for name in [m for m in sys.modules if m == "nki" or m.startswith("nki.")]:
        del sys.modules[name]


def test_this_environment_uses_the_interpreter():
    assert seam.BACKEND == "interpreter"
    assert seam.nki is interp.nki and seam.nl is interp.nl and seam.nisa is interp.nisa
    assert callable(seam.nki.jit) and callable(seam.nki.simulate)
    assert seam.nki.language is seam.nl and seam.nki.isa is seam.nisa


def test_empty_placeholder_package_is_not_taken_for_the_real_nki(fake_nki):
    fake_nki({"__init__.py": "# the PyPI placeholder: an empty module\n"})
    import nki  # noqa: F401 - it imports fine...

    assert seam._real_nki() is None  # ...but is not the Neuron package
    backend, nki_mod, nl, nisa = seam._select()
    assert backend == "interpreter" and nki_mod is interp.nki
    assert nl is interp.nl and nisa is interp.nisa


def test_placeholder_with_partial_api_is_not_enough(fake_nki):
    files = dict(GENUINE)
    files["isa/__init__.py"] = "nc_matmul = None\n"  # present but not callable
    fake_nki(files)
    assert seam._select()[0] == "interpreter"


def test_a_package_that_fails_to_import_falls_back(fake_nki):
    fake_nki({"__init__.py": "raise RuntimeError('no Neuron runtime here')\n"})
    assert seam._select()[0] == "interpreter"


def test_genuine_package_is_used_unless_the_interpreter_is_forced(fake_nki, monkeypatch):
    fake_nki(GENUINE)
    backend, nki_mod, nl, nisa = seam._select()
    assert backend == "neuron"
    assert nki_mod.__name__ == "nki" and nl.__name__ == "nki.language"
    assert nisa.__name__ == "nki.isa"
    monkeypatch.setenv(seam.BACKEND_ENV_VAR, "interpreter")
    assert seam._select()[0] == "interpreter"
    monkeypatch.setenv(seam.BACKEND_ENV_VAR, "auto")
    assert seam._select()[0] == "neuron"


def test_forcing_neuron_without_the_package_is_an_error(fake_nki, monkeypatch):
    fake_nki({"__init__.py": ""})
    monkeypatch.setenv(seam.BACKEND_ENV_VAR, "neuron")
    with pytest.raises(ImportError, match="placeholder"):
        seam._select()


def test_unknown_backend_setting_names_the_choices(monkeypatch):
    monkeypatch.setenv(seam.BACKEND_ENV_VAR, "cuda")
    with pytest.raises(ValueError, match="'auto', 'interpreter' or 'neuron'; got 'cuda'"):
        seam._select()
