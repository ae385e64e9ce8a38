"""The NKI language subset, checked at `nki.jit` time (first launch of a kernel).

The NKI compiler, not Python, runs a kernel body and every function it calls ("not all
Python constructs and libraries are supported within a NKI function", NKI language
guide). The guide lists the values (None, bool, 32-bit int and float, str, tensors) and
containers (tuples, lists, string-keyed dicts, NKIObject classes) the language has. So
this check rejects, in the kernel and in every Python function reachable from it (called
or passed by name, resolved through the function's globals and closure):

- generator expressions and generator functions (`yield`): no generator value exists;
- set displays and comprehensions, `set()` / `frozenset()`: no set container exists;
- builtins outside the ones the guide's values need, AWS's own kernels use, and the
  reductions `sum` / `any` / `all` over a list (`ALLOWED_BUILTINS`; refused e.g.
  `sorted`, `reversed`, `set`, `iter`, `next`, `filter`, `open`);
- callables of Python libraries other than `math` (e.g. `collections.defaultdict`,
  `itertools.*`, `functools.*`);

- `.itemsize`: an NKI dtype is a string (NKI 0.6 `DType = str`), so `dtype.itemsize`
  fails at specialization on the real compiler; reported here with its line (the
  interpreter's dtypes also raise rule DTYPE_STR for any NumPy dtype attribute at run
  time);

each reported with the construct, the file and the line (rule LANGUAGE). Functions of
the interpreter itself (the `nki` API) are not inspected.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import sys
import textwrap
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .errors import fail

# Module prefixes whose violations only warn. Empty: the project's own kernels pass the
# check like every other kernel (AWS's, a user's).
TRANSITIONAL: tuple[str, ...] = ()

ALLOWED_BUILTINS = frozenset(
    {
        "range", "len", "min", "max", "abs", "int", "float", "bool", "str", "tuple",
        "list", "dict", "isinstance", "print", "divmod", "getattr", "hasattr", "enumerate",
        "zip", "map", "hash", "round", "pow", "type", "super", "id", "repr", "slice",
        "sum", "any", "all",
        "object", "callable", "NotImplementedError", "ValueError", "TypeError",
        "RuntimeError", "AssertionError", "KeyError", "IndexError", "Exception",
    }
)  # fmt: skip
# Python libraries a kernel may call into at specialization (compile-time math).
ALLOWED_LIBRARIES = frozenset({"math", "typing", "dataclasses", "enum"})
_INTERP_DIR = str(Path(__file__).resolve().parent)
_SEAM = "nki_kernels.nki"


def _is_api(obj: Any) -> bool:
    """Whether `obj` belongs to the NKI API itself (the interpreter or the seam)."""
    mod = getattr(obj, "__module__", None) or ""
    if mod == _SEAM or mod.startswith("nki_kernels.interp"):
        return True
    return mod == "nki" or mod.startswith("nki.")


def _library(obj: Any) -> str | None:
    """The top-level Python library `obj` comes from, if it is not user or NKI code."""
    mod = getattr(obj, "__module__", None)
    if not isinstance(mod, str) or _is_api(obj):
        return None
    top = mod.split(".")[0]
    if top == "builtins":
        return None
    stdlib: frozenset[str] = getattr(sys, "stdlib_module_names", frozenset())
    return top if top in stdlib or top in ("numpy", "torch", "scipy") else None


class _Checker:
    def __init__(self) -> None:
        self.seen: set[Any] = set()
        self.errors: list[str] = []

    def visit_function(self, fn: Callable[..., Any]) -> None:
        code = getattr(fn, "__code__", None)
        if code is None or code in self.seen or _is_api(fn):
            return
        self.seen.add(code)
        try:
            source = textwrap.dedent(inspect.getsource(fn))
            first = inspect.getsourcelines(fn)[1]
        except (OSError, TypeError):
            return  # no source (built in C, or generated): nothing to inspect
        try:
            tree = ast.parse(source)
        except SyntaxError:
            return
        filename = code.co_filename
        scope = self._scope(fn)
        # names bound inside the function (parameters, assignments, loop targets, nested
        # defs) are locals, not the globals or builtins of the same name
        for node in ast.walk(tree):
            if isinstance(node, ast.arg):
                scope.pop(node.arg, None)
            elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                scope.pop(node.id, None)
            elif isinstance(node, ast.FunctionDef) and node is not tree.body[0]:
                scope.pop(node.name, None)
        for node in ast.walk(tree):
            where = f"{filename}:{first + getattr(node, 'lineno', 1) - 1}"
            problem = self._construct(node)
            if problem:
                self.errors.append(f"{problem} at {where} (in {fn.__qualname__})")
            for name, obj in self._referenced(node, scope):
                if isinstance(obj, types.BuiltinFunctionType | type) and _is_builtin(name, obj):
                    if name not in ALLOWED_BUILTINS:
                        self.errors.append(
                            f"builtin {name}() at {where} (in {fn.__qualname__}): not in the "
                            "NKI language"
                        )
                    continue
                lib = _library(obj)
                if lib is not None and lib not in ALLOWED_LIBRARIES and callable(obj):
                    self.errors.append(
                        f"{lib}.{getattr(obj, '__qualname__', name)} at {where} "
                        f"(in {fn.__qualname__}): a Python library outside the NKI language"
                    )
                    continue
                for target in _functions(obj):
                    self.visit_function(target)

    @staticmethod
    def _scope(fn: Callable[..., Any]) -> dict[str, Any]:
        scope = dict(vars(builtins))
        scope.update(getattr(fn, "__globals__", {}))
        closure = getattr(fn, "__closure__", None) or ()
        for name, cell in zip(fn.__code__.co_freevars, closure, strict=False):
            try:
                scope[name] = cell.cell_contents
            except ValueError:
                pass
        return scope

    @staticmethod
    def _construct(node: ast.AST) -> str | None:
        if isinstance(node, ast.Attribute) and node.attr == "itemsize":
            return "`.itemsize` (NKI dtypes are strings: compare them by value)"
        if isinstance(node, ast.GeneratorExp):
            return "generator expression"
        if isinstance(node, ast.Yield | ast.YieldFrom):
            return "generator function (yield)"
        if isinstance(node, ast.Set | ast.SetComp):
            return "set (not an NKI container)"
        if isinstance(node, ast.AsyncFunctionDef | ast.Await):
            return "async code"
        return None

    @staticmethod
    def _referenced(node: ast.AST, scope: dict[str, Any]) -> Iterator[tuple[str, Any]]:
        """Objects a Name or a module attribute chain (`mod.fn`) refers to."""
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in scope:
            yield node.id, scope[node.id]
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            chain = []
            cur: ast.AST = node
            while isinstance(cur, ast.Attribute):
                chain.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name) and isinstance(scope.get(cur.id), types.ModuleType):
                obj: Any = scope[cur.id]
                for attr in reversed(chain):
                    if not isinstance(obj, types.ModuleType) and not isinstance(obj, type):
                        return
                    try:
                        obj = getattr(obj, attr, None)
                    except Exception:
                        return
                    if obj is None:
                        return
                if not isinstance(obj, types.ModuleType):
                    yield ".".join([cur.id, *reversed(chain)]), obj


def _is_builtin(name: str, obj: Any) -> bool:
    return getattr(builtins, name, None) is obj


def _functions(obj: Any) -> list[Callable[..., Any]]:
    """The Python functions to inspect behind a referenced object."""
    fn = getattr(obj, "fn", None)  # an nki.jit Kernel
    if isinstance(fn, types.FunctionType):
        return [fn]
    if isinstance(obj, types.FunctionType):
        return [obj]
    return []  # classes are not followed: which methods a kernel calls is not static


def check_kernel(fn: Callable[..., Any]) -> None:
    """Raise rule LANGUAGE if `fn` or a function it reaches is outside the NKI subset."""
    c = _Checker()
    c.visit_function(fn)
    if c.errors:
        shown = "; ".join(c.errors[:8])
        more = f" (+{len(c.errors) - 8} more)" if len(c.errors) > 8 else ""
        raise fail("LANGUAGE", f"kernel {fn.__qualname__}: {shown}{more}")
