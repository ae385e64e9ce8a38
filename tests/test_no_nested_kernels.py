"""No kernel of the package calls another `@nki.jit` kernel, and the entry points that
share a body are thin.

NKI 0.6 documents the decorator on the top-level kernel only, so a kernel that needs
another's instructions calls its undecorated body (traced inline, as NKI inlines helpers):
`decode_stream_body` (the decode op's streamed kernel, also the serving decode step's),
`serving_attention_body` (the segmented serving kernel, also the mixed step's),
`serving_decode_body`, `serving_mixed_body`, `moe_mlp_fwd_body`, `moe_mlp_bwd_body`. Their
`@nki.jit` entry points return the body's result on their own arguments, unchanged."""

from __future__ import annotations

import ast
import inspect
import pkgutil
import textwrap
from importlib import import_module
from pathlib import Path
from types import ModuleType

import pytest

import nki_kernels
from nki_kernels.attention.decode_stream import decode_stream_body, decode_stream_fwd
from nki_kernels.moe.blockwise_mlp import moe_mlp_fwd, moe_mlp_fwd_body
from nki_kernels.moe.blockwise_mlp_bwd import moe_mlp_bwd, moe_mlp_bwd_body
from nki_kernels.nki import nki
from nki_kernels.serving.decode_step import (
    serving_decode_body,
    serving_decode_fwd,
    serving_mixed_body,
    serving_mixed_fwd,
)
from nki_kernels.serving.segmented import serving_attention_body, serving_attention_fwd

Kernel = type(decode_stream_fwd)  # what `@nki.jit` makes on this backend
THIN = [
    (decode_stream_fwd, decode_stream_body),
    (serving_attention_fwd, serving_attention_body),
    (serving_decode_fwd, serving_decode_body),
    (serving_mixed_fwd, serving_mixed_body),
    (moe_mlp_fwd, moe_mlp_fwd_body),
    (moe_mlp_bwd, moe_mlp_bwd_body),
]


def jit_kernels_called(source: str, names: dict[str, object]) -> list[str]:
    """'caller -> callee' for each call, inside a function of `source`, of a name (or a
    module attribute, `mod.kernel`, or a launcher, `kernel[2]`) that is an `@nki.jit`
    kernel in `names` (host code passes kernels to `launch`; it does not call them)."""
    found = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, ast.FunctionDef):
            continue
        for call in ast.walk(fn):
            if not isinstance(call, ast.Call):
                continue
            f = call.func.value if isinstance(call.func, ast.Subscript) else call.func
            if isinstance(f, ast.Name):
                target, label = names.get(f.id), f.id
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                target = getattr(names.get(f.value.id), f.attr, None)
                label = f"{f.value.id}.{f.attr}"
            else:
                continue
            if isinstance(target, Kernel):
                found.append(f"{fn.name} -> {label}")
    return found


def _package_modules() -> list[ModuleType]:
    names = [i.name for i in pkgutil.walk_packages(nki_kernels.__path__, "nki_kernels.")]
    return [import_module(n) for n in names]


def test_no_kernel_of_the_package_calls_a_jit_kernel() -> None:
    modules = _package_modules()
    assert len(modules) > 100  # every module of the package, not one folder
    found = {}
    for module in modules:
        source = Path(module.__file__).read_text()  # type: ignore[arg-type]
        calls = jit_kernels_called(source, vars(module))
        if calls:
            found[module.__name__] = calls
    assert found == {}


def test_the_scan_finds_a_kernel_calling_a_jit_kernel() -> None:
    @nki.jit
    def inner(x):
        return x

    source = textwrap.dedent("""
        def outer(x):
            return inner(x)

        def outer_launcher(x):
            return inner[2](x)

        def outer_attribute(x):
            return mod.inner(x)
    """)
    mod = ModuleType("mod")
    mod.inner = inner  # type: ignore[attr-defined]
    got = jit_kernels_called(source, {"inner": inner, "mod": mod})
    assert got == ["outer -> inner", "outer_launcher -> inner", "outer_attribute -> mod.inner"]


@pytest.mark.parametrize(("kernel", "body"), THIN, ids=lambda x: getattr(x, "__name__", ""))
def test_an_entry_point_returns_its_body_on_its_own_arguments(kernel: Kernel, body: object) -> None:
    fn = kernel.fn  # type: ignore[attr-defined]
    assert inspect.signature(fn) == inspect.signature(body)  # type: ignore[arg-type]
    stmts = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0].body  # type: ignore[attr-defined]
    if isinstance(stmts[0], ast.Expr) and isinstance(stmts[0].value, ast.Constant):
        stmts = stmts[1:]  # the docstring
    assert len(stmts) == 1 and isinstance(stmts[0], ast.Return)
    call = stmts[0].value
    assert isinstance(call, ast.Call) and not call.keywords
    assert isinstance(call.func, ast.Name) and call.func.id == body.__name__  # type: ignore[attr-defined]
    assert [a.id for a in call.args if isinstance(a, ast.Name)] == list(
        inspect.signature(fn).parameters
    )
