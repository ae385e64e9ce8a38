"""Compiled-kernel cache: one specialization per key, shape-checked calls."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest
from kernels_for_tests import copy_kernel

from nki_kernels.runtime import kernel_cache
from nki_kernels.runtime.kernel_cache import KernelCache, kernel_name, kernel_source_hash
from nki_kernels.runtime.launch import launch
from nki_kernels.targets import get_target


def test_compiles_once_per_key() -> None:
    cache = KernelCache()
    x = np.ones((4, 8), np.float32)
    for _ in range(3):
        launch(copy_kernel, x, 2.0, cache=cache)
    assert cache.compiles == 1 and cache.hits == 2
    launch(copy_kernel, x, 3.0, cache=cache)  # another specialization-time value
    launch(copy_kernel, x.astype(np.float16), 2.0, cache=cache)  # another dtype
    launch(copy_kernel, np.ones((5, 8), np.float32), 2.0, cache=cache)  # another shape
    launch(copy_kernel, x, 2.0, cache=cache, target="trn3")  # another target
    assert cache.compiles == 5
    assert cache.compiles_for(copy_kernel) == 5
    cache.clear()
    assert cache.compiles == 0


def test_a_specialization_refuses_other_shapes() -> None:
    cache = KernelCache()
    x = np.ones((4, 8), np.float32)
    spec = cache.get(
        copy_kernel, (x, 2.0), {}, get_target("trn2"), 1, "interpreter", lambda *a, **k: None
    )
    with pytest.raises(ValueError, match=r"argument 0 expected \(\(4, 8\), 'float32'\)"):
        spec(np.ones((5, 8), np.float32), 2.0)


def test_statics_must_be_hashable() -> None:
    with pytest.raises(TypeError, match="must be hashable"):
        launch(copy_kernel, np.ones((2, 2), np.float32), [1.0], cache=KernelCache())


def test_kernel_identity_and_source_hash() -> None:
    assert kernel_name(copy_kernel) == "kernels_for_tests.copy_kernel"
    h = kernel_source_hash(copy_kernel)
    assert len(h) == 16 and h == kernel_source_hash(copy_kernel)


def test_source_hash_covers_helpers_in_sibling_modules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "hashpkg_fixture"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helpers.py").write_text("def tile():\n    return 128\n")
    (pkg / "kern.py").write_text(
        "from .helpers import tile\n\n\ndef kernel(x):\n    return tile() * x\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(kernel_cache, "_hash_memo", {})
    kern = importlib.import_module("hashpkg_fixture.kern")
    before = kernel_source_hash(kern.kernel)
    assert [m.__name__ for m in kernel_cache._kernel_modules(kern.kernel)] == [
        "hashpkg_fixture.helpers",
        "hashpkg_fixture.kern",
    ]
    (pkg / "helpers.py").write_text("def tile():\n    return 64\n")
    importlib.reload(sys.modules["hashpkg_fixture.helpers"])
    kernel_cache._hash_memo.clear()
    assert kernel_source_hash(kern.kernel) != before
    for name in [m for m in sys.modules if m.startswith("hashpkg_fixture")]:
        monkeypatch.delitem(sys.modules, name)
