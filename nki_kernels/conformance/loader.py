"""Import AWS's NKI kernels unmodified, with their `nki` imports mapped to the interpreter.

Kernels from a local aws-neuron/nki-library checkout (`src/nkilib_src/nkilib/...`) or
from the aws-neuron-sdk's `nki/examples` do `import nki`, `import nki.language as nl`,
`import nki.isa as nisa`, `from nki.isa.constants import oob_mode`, `import nki.typing
as nt`, `import nki.collectives as ncc`. While the mapping is active those names resolve
to the interpreter's modules (`nki_kernels.interp.package.MODULES`); no file of the
checkout is copied or edited.

API:

- `load_module(checkout_root, dotted_name)` -> the imported module. For nki-library,
  `dotted_name` is the package path, e.g. `"nkilib.core.attention.attention_cte"`; for
  the SDK examples it is the file's path under `nki/examples` with dots,
  e.g. `"matrix_multiplication.matrix_multiplication_nki_kernels"`.
- `load_kernel(checkout_root, dotted_name, attr)` -> one callable of that module (a
  `@nki.jit` kernel, or a plain function such as nki-library's `attention_cte`, which
  its tests wrap in `nki.jit` themselves).
- `kernels(module)` -> {name: Kernel} of the `@nki.jit` kernels the module defines.
- `jit(fn)` -> `fn` as an interpreter kernel (`nki.jit(fn)`), callable as `k(...)` or
  `k[2](...)`, and accepted by `nki_kernels.interp.run(k, ..., trace_only=True)`.
- `mapped_nki()` context manager: the mapping itself; `checkout_context(root)` adds the
  checkout's import roots to `sys.path` too, for code of the checkout that imports
  lazily (nki-library's references import its `test.*` helpers inside functions).
- `module_names(checkout_root)` -> every importable kernel module name of the checkout.

The mapping is scoped: `sys.modules` entries named `nki*` / `neuronxcc*` are restored on
exit, so a real Neuron `nki`, if installed, is untouched outside the block. Imported
checkout modules stay cached in `sys.modules` (under `nkilib_src.nkilib.*`, the name
AWS's tests use, or the example's file name), like any import; loading from a different
checkout root drops the cached ones first.

Example (trace-only, realistic shapes, no arithmetic)::

    from nki_kernels.conformance.loader import load_kernel, jit
    from nki_kernels.interp import run, TensorSpec
    cte = jit(load_kernel(ROOT, "nkilib.core.attention.attention_cte", "attention_cte"))
    res = run(cte, TensorSpec((1, 128, 512), "bfloat16"), ..., trace_only=True)
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from ..interp.launch import Kernel, settings
from ..interp.launch import jit as _jit
from ..interp.package import MODULES

NKILIB_SRC = Path("src") / "nkilib_src"  # holds the `nkilib` package
SDK_EXAMPLES = Path("nki") / "examples"
_MAPPED_PREFIXES = ("nki", "neuronxcc")
_loaded_roots: dict[str, Path] = {}  # top-level package / module -> the root it came from


def _is_mapped(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in _MAPPED_PREFIXES)


@contextlib.contextmanager
def mapped_nki() -> Iterator[None]:
    """Within the block, `import nki...` (and `neuronxcc.nki.typing`) gives the interpreter,
    `import neuron_dtypes` a stand-in when AWS's package is absent, and launches drop dead
    on-chip allocations as the compiler does (`settings(free_unused_tiles=True)`: AWS's
    small test shapes leave buffers unused)."""
    saved = {k: v for k, v in sys.modules.items() if _is_mapped(k)}
    for k in saved:
        del sys.modules[k]
    sys.modules.update(MODULES)
    standin = (
        "neuron_dtypes" not in sys.modules and importlib.util.find_spec("neuron_dtypes") is None
    )
    try:
        with contextlib.ExitStack() as stack:
            if standin:
                from . import neuron_dtypes_standin

                stack.enter_context(neuron_dtypes_standin.installed())
                sys.modules["neuron_dtypes"] = neuron_dtypes_standin
            stack.enter_context(settings(free_unused_tiles=True))
            yield
    finally:
        if standin:
            sys.modules.pop("neuron_dtypes", None)
        for k in [k for k in sys.modules if _is_mapped(k)]:
            del sys.modules[k]
        sys.modules.update(saved)


def _root(checkout_root: str | Path) -> Path:
    root = Path(checkout_root).expanduser().resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"checkout_root: expected a directory; got {str(root)!r}")
    return root


def checkout_kind(checkout_root: str | Path) -> str:
    """'nki-library' or 'sdk' (aws-neuron-sdk), from the checkout's layout."""
    root = _root(checkout_root)
    if (root / NKILIB_SRC / "nkilib").is_dir():
        return "nki-library"
    if (root / SDK_EXAMPLES).is_dir():
        return "sdk"
    raise FileNotFoundError(
        f"checkout_root: expected an nki-library checkout (with {NKILIB_SRC}/nkilib) or an "
        f"aws-neuron-sdk checkout (with {SDK_EXAMPLES}); got {str(root)!r}"
    )


def _forget(top: str) -> None:
    for k in [k for k in sys.modules if k == top or k.startswith(top + ".")]:
        del sys.modules[k]


@contextlib.contextmanager
def _on_path(path: Path) -> Iterator[None]:
    entry = str(path)
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(entry)


@contextlib.contextmanager
def checkout_context(checkout_root: str | Path) -> Iterator[None]:
    """`mapped_nki()` plus the checkout's import roots on `sys.path`, for running code of
    the checkout that imports lazily (references, test helpers)."""
    root = _root(checkout_root)
    if checkout_kind(root) == "nki-library":
        paths = [root / "src", root]  # `nkilib_src.nkilib...` and its `test.*` helpers
    else:
        paths = [root / SDK_EXAMPLES]
    with contextlib.ExitStack() as stack:
        stack.enter_context(mapped_nki())
        for p in reversed(paths):
            stack.enter_context(_on_path(p))
        yield


def load_module(checkout_root: str | Path, dotted_name: str) -> ModuleType:
    """Import `dotted_name` from the checkout, with `nki` mapped to the interpreter.

    nki-library modules are imported as `nkilib_src.nkilib.<...>`, the name AWS's own
    tests use, so that a kernel and its test helpers share one copy of each module.
    """
    root = _root(checkout_root)
    kind = checkout_kind(root)
    if kind == "nki-library":
        if dotted_name.startswith("nkilib."):
            dotted_name = "nkilib_src." + dotted_name
        if not dotted_name.startswith(("nkilib_src.nkilib.", "test.")):
            raise ValueError(f"dotted_name: expected 'nkilib.<...>'; got {dotted_name!r}")
        if _loaded_roots.get("nkilib") not in (None, root):
            _forget("nkilib_src")
            _forget("test")
        _loaded_roots["nkilib"] = root
        with checkout_context(root):
            return importlib.import_module(dotted_name)
    path = root / SDK_EXAMPLES / Path(*dotted_name.split(".")).with_suffix(".py")
    if not path.is_file():
        raise FileNotFoundError(f"dotted_name: no example file {str(path)!r}")
    name = path.stem
    cached = sys.modules.get(name)
    if cached is not None and _loaded_roots.get(name) == path:
        return cached
    _forget(name)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with mapped_nki(), _on_path(path.parent):  # examples import their siblings by name
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    _loaded_roots[name] = path
    return module


def load_kernel(checkout_root: str | Path, dotted_name: str, attr: str) -> Callable[..., Any]:
    """One callable (`@nki.jit` kernel or plain function) of a checkout module."""
    module = load_module(checkout_root, dotted_name)
    try:
        return getattr(module, attr)  # type: ignore[no-any-return]
    except AttributeError:
        raise AttributeError(f"attr: {dotted_name} has no {attr!r}") from None


def kernels(module: ModuleType) -> dict[str, Kernel]:
    """The `@nki.jit` kernels defined in `module` (not the ones it imports)."""
    out = {}
    for name, value in vars(module).items():
        if isinstance(value, Kernel) and value.fn.__module__ == module.__name__:
            out[name] = value
    return out


def jit(fn: Callable[..., Any] | Kernel) -> Kernel:
    """`fn` as an interpreter kernel (kernels already decorated come back as they are)."""
    return fn if isinstance(fn, Kernel) else _jit(fn)  # type: ignore[no-any-return]


def module_names(checkout_root: str | Path) -> list[str]:
    """The kernel modules of a checkout, as `load_module` names them (references skipped)."""
    root = _root(checkout_root)
    if checkout_kind(root) == "nki-library":
        base = root / NKILIB_SRC
        files = sorted((base / "nkilib").rglob("*.py"))
    else:
        base = root / SDK_EXAMPLES
        files = sorted(base.rglob("*.py"))
    names = []
    for f in files:
        rel = f.relative_to(base).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            continue
        if parts[-1].endswith(("_torch", "_jax", "_numpy")):
            continue
        names.append(".".join(parts))
    return names
