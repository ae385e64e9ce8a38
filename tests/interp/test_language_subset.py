"""The NKI language subset, checked at the first launch of an nki.jit kernel (rule
LANGUAGE): each construct outside it is named with its file and line, in the kernel and
in the helpers it reaches; the project's own kernels are inside."""

from __future__ import annotations

import collections
import importlib
import itertools
import pkgutil

import numpy as np
import pytest

from nki_kernels.interp import NkiValidationError, nisa, nki, nl
from nki_kernels.interp.launch import Kernel
from nki_kernels.interp.subset import check_kernel

X = np.ones((2, 2), np.float32)


def _copy(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, x.dtype)
    nisa.dma_copy(dst=t, src=x)
    nisa.dma_copy(dst=out, src=t)
    return out


def _helper_with_sorted(xs):
    return sorted(xs)


def _helper_with_defaultdict():
    return collections.defaultdict(list)


def _rejected(fn, *words):
    k = nki.jit(fn)
    with pytest.raises(NkiValidationError) as e:
        k(X)
    msg = str(e.value)
    assert e.value.rule == "LANGUAGE", msg
    for w in words:
        assert w in msg, msg
    return msg


def test_a_generator_expression_in_the_kernel_is_named_with_file_and_line():
    def kernel(x):
        n = max(d for d in x.shape)
        assert n == 2
        return _copy(x)

    _rejected(kernel, "generator expression", "test_language_subset.py:", "kernel")


def test_sets_are_not_an_nki_container():
    def kernel(x):
        s = {1, 2}
        assert s
        return _copy(x)

    _rejected(kernel, "set (not an NKI container)")


def test_sorted_in_a_helper_is_found_through_the_call():
    def kernel(x):
        assert _helper_with_sorted([2, 1]) == [1, 2]
        return _copy(x)

    _rejected(kernel, "builtin sorted()", "_helper_with_sorted")


def test_python_libraries_outside_the_language_are_refused():
    def kernel(x):
        assert not _helper_with_defaultdict()
        return _copy(x)

    _rejected(kernel, "collections.defaultdict", "_helper_with_defaultdict")

    def chain(x):
        assert list(itertools.chain([1], [2])) == [1, 2]
        return _copy(x)

    _rejected(chain, "itertools.chain")


def test_generator_functions_are_refused():
    def gen():
        yield 1

    def kernel(x):
        assert list(gen()) == [1]
        return _copy(x)

    _rejected(kernel, "generator function (yield)", "gen")


def test_the_documented_subset_passes():
    def kernel(x):
        d = {}
        d["a"] = 1
        a = d.setdefault("b", 2)  # documented in the language guide
        items = [i * 2 for i in range(3)]  # lists and comprehensions into lists
        items.append(len(x.shape))
        assert all([i >= 0 for i in items]) and a == 2 and max(items) == 4
        return _copy(x)

    np.testing.assert_array_equal(nki.jit(kernel)(X), X)


def test_itemsize_of_a_dtype_is_refused_as_on_the_compiler():
    def kernel(x):
        assert x.dtype.itemsize == 4
        return _copy(x)

    _rejected(kernel, "`.itemsize` (NKI dtypes are strings")


def test_the_check_runs_once_per_kernel():
    k = nki.jit(_copy)
    k(X)
    assert k._checked
    k(X)


def test_every_kernel_of_the_project_is_inside_the_language():
    # a meta-test over every nki.jit kernel the package defines (attention, MoE, norms,
    # baselines, calibration): each passes the same check as AWS's and a user's kernels
    import nki_kernels
    from nki_kernels.interp import subset

    assert subset.TRANSITIONAL == ()
    kernels, errors = 0, []
    for m in pkgutil.walk_packages(nki_kernels.__path__, "nki_kernels."):
        mod = importlib.import_module(m.name)
        for v in vars(mod).values():
            if isinstance(v, Kernel) and v.fn.__module__ == mod.__name__:
                kernels += 1
                try:
                    check_kernel(v.fn)
                except NkiValidationError as e:
                    errors.append(str(e))
    assert kernels >= 20 and errors == []


def test_locals_named_like_builtins_are_not_builtins():
    def kernel(x):
        input = x
        sorted = 3
        assert sorted == 3
        return _copy(input)

    np.testing.assert_array_equal(nki.jit(kernel)(X), X)
