"""The importable `nki` package: NKIObject, nki.typing / collectives / isa.constants,
names the interpreter does not support (rule UNSUPPORTED) and raw dge_mode values."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import numpy as np
import pytest

from nki_kernels.interp import NkiValidationError, nisa, nki, nl, run
from nki_kernels.interp.package import MODULES


@dataclass
class _Section(nl.NKIObject):
    idx = None
    offset = 0
    causal: bool = False


class _Spec(nl.NKIObject):
    rows: int = 2
    cols: int = 3

    def __post_init__(self):
        self.size = self.rows * self.cols


def test_nkiobject_generates_init_from_plain_class_attributes():
    s = _Section(3, offset=5)
    assert (s.idx, s.offset, s.causal) == (3, 5, False)
    assert _Section().idx is None
    assert _Spec(cols=4).size == 8


def test_nkiobject_fields_without_defaults_may_be_left_out():
    class Dims(nl.NKIObject):
        rows: int
        derived: int

        def __post_init__(self):
            self.derived = self.rows * 2

    class Plain(nl.NKIObject):
        rows: int

    assert Dims(rows=3).derived == 6 and Plain().rows is None


def test_nkiobject_init_rejects_unknown_and_doubled_fields():
    with pytest.raises(TypeError, match="unknown field"):
        _Section(bogus=1)
    with pytest.raises(TypeError, match="given twice"):
        _Section(1, idx=2)


def test_nkiobject_keeps_a_user_init_and_dataclass_factories():
    class Own(nl.NKIObject):
        def __init__(self, n):
            self.n = n * 2

    @dataclass
    class Fact(nl.NKIObject):
        items: list = dataclasses.field(default_factory=list)

    assert Own(2).n == 4
    a, b = Fact(), Fact()
    assert a.items == [] and a.items is not b.items


def test_unhashable_nkiobject_instances_are_kernel_arguments():
    def kernel(x, spec):
        out = nl.ndarray((spec.rows, spec.cols), x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=x[0 : spec.rows, 0 : spec.cols])
        return out

    @dataclass
    class Shape(nl.NKIObject):
        rows = 2
        cols = 3

    spec = Shape()  # dataclass(eq=True) makes it unhashable
    with pytest.raises(TypeError):
        hash(spec)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = run(kernel, x, spec).outputs
    np.testing.assert_array_equal(out, x[:2, :3])
    assert run(kernel, x, _Spec(rows=1)).outputs.shape == (1, 3)  # a plain NKIObject too


def test_package_modules_cover_the_import_paths_of_aws_kernels():
    for name in ("nki", "nki.language", "nki.isa", "nki.isa.constants", "nki.typing",
                 "nki.collectives", "neuronxcc.nki.typing"):  # fmt: skip
        assert name in MODULES
    assert MODULES["nki.isa.constants"].oob_mode is nisa.oob_mode
    nt = MODULES["nki.typing"]
    assert repr(nt.tensor[128, 512]) == "nt.tensor[128, 512]"
    assert nki.collectives.ReplicaGroup(replica_groups=((0, 1),)).replica_groups == ((0, 1),)


@pytest.mark.parametrize(
    "where, name",
    [(nl, "rand"), (nisa, "rand2")],
)
def test_documented_but_unimplemented_names_raise_unsupported(where, name):
    with pytest.raises(NkiValidationError) as e:
        getattr(where, name)
    assert e.value.rule == "UNSUPPORTED" and name in str(e.value)
    with pytest.raises(AttributeError):
        getattr(where, "no_such_name_anywhere")  # noqa: B009


def test_dma_copy_takes_the_raw_dge_mode_value_nki_library_passes():
    def kernel(x):
        t = nl.ndarray(x.shape, x.dtype)
        nisa.dma_copy(dst=t, src=x, dge_mode=3)
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    res = run(kernel, np.ones((2, 2), np.float32))
    assert res.trace.instrs[0].attrs["dge"] == "none"

    def bad(x):
        t = nl.ndarray(x.shape, x.dtype)
        nisa.dma_copy(dst=t, src=x, dge_mode=7)

    with pytest.raises(NkiValidationError) as e:
        run(bad, np.ones((2, 2), np.float32))
    assert e.value.rule == "ARG" and "dge_mode" in str(e.value)


def test_nki_dtype_is_a_module_of_the_dtype_names_as_nki_librarys_qkv_tests_import_it():
    from nki_kernels.conformance.loader import mapped_nki

    with mapped_nki():
        import nki.dtype as nt  # type: ignore[import-not-found]

        assert nt.float8_e4m3 == nl.float8_e4m3 and nt.bfloat16 == "bfloat16"
        assert np.zeros(2, dtype=nt.float8_e4m3).dtype.name == "float8_e4m3"
        with pytest.raises(AttributeError, match=r"'nki\.dtype' has no attribute 'ndarray'"):
            nt.ndarray  # noqa: B018


def test_the_readme_lists_exactly_the_unsupported_names():
    from pathlib import Path

    from nki_kernels.interp import collectives, isa, language

    doc = (Path(__file__).parents[2] / "docs" / "readme" / "interpreter.md").read_text()
    part = doc[doc.index("raise `NotSupportedError`") : doc.index("Every `nki.collectives`")]
    nl_part, nisa_part = part.split("`nisa`:")
    listed = {
        "nl": set(re.findall(r"`([a-z_0-9A-Z]+)`", nl_part.split("`nl`:")[1])),
        "nisa": set(re.findall(r"`([a-z_0-9A-Z]+)`", nisa_part)) - {"val_dst", "idx_dst"},
    }
    assert listed["nl"] == set(language.NOT_SUPPORTED)
    assert listed["nisa"] == set(isa.NOT_SUPPORTED)
    assert not collectives.NOT_SUPPORTED
