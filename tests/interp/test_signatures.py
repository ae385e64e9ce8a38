"""Every public nki / nl / nisa function of the NKI 0.6 API reference exists here with
the documented parameter names, order and defaults, or is named as unsupported (rule
UNSUPPORTED): so drift from the documented API shows up in CI."""

from __future__ import annotations

import inspect

import pytest
from nki_api_signatures import SIGNATURES

from nki_kernels.interp import nisa, nki, nl
from nki_kernels.interp.errors import NotSupportedError

MODULES = {"nki": nki, "nl": nl, "nisa": nisa, "ncc": nki.collectives}
# names the docs' defaults use, resolved in our API
NAMESPACE = {
    "nl": nl,
    "nisa": nisa,
    **{
        k: getattr(nl, k)
        for k in ("sbuf", "psum", "hbm", "shared_hbm", "uint8", "float32", "equal", "maximum")
    },
    **{
        k: getattr(nisa, k)
        for k in ("engine", "dge_mode", "oob_mode", "reduce_cmd", "matmul_perf_mode", "dma_engine")
    },
}
NO_DEFAULT = inspect.Parameter.empty


def _resolve(qualname):
    mod, name = qualname.split(".", 1)
    try:
        return getattr(MODULES[mod], name)
    except NotSupportedError:
        return None


def _params(obj):
    sig = inspect.signature(obj)
    return [p for p in sig.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def test_the_table_covers_the_reference():
    assert len(SIGNATURES) >= 150
    assert SIGNATURES["nisa.nc_matmul"][0] == ("dst", None)


@pytest.mark.parametrize("qualname", sorted(SIGNATURES))
def test_documented_signature(qualname):
    obj = _resolve(qualname)
    if obj is None:
        pytest.skip(f"{qualname} is named as unsupported by the interpreter")
    documented = SIGNATURES[qualname]
    ours = _params(obj)
    assert [p.name for p in ours] == [n for n, _ in documented], qualname
    for p, (name, default) in zip(ours, documented, strict=True):
        if default is None:
            assert p.default is NO_DEFAULT, f"{qualname}({name}): documented without a default"
        elif default != "...":
            want = eval(default, NAMESPACE)
            assert p.default == want or p.default is want, f"{qualname}({name}={default})"


def test_unsupported_names_are_few_and_named():
    missing = [q for q in SIGNATURES if _resolve(q) is None]
    assert len(missing) <= 30, missing
