"""`nl.NKIObject`: the base of the classes a kernel may define and pass around.

The NKI language guide: for an NKIObject class "the compiler will create the initializer
functions `__init__` and `__post_init__` if they are not provided". AWS's kernels rely on
it: `@dataclass class SectionParams(nl.NKIObject)` lists plain (unannotated) class
attributes, which `dataclass` alone would not turn into fields. So every subclass that
does not define `__init__` itself gets a generated one whose fields are, in definition
order over the class hierarchy, the annotated attributes and the plain data attributes;
each field's class value is its default (`dataclasses.field` defaults and factories are
honoured; a field without a default that is not passed starts as None). The generated
`__init__` calls `__post_init__` when the class has one.

Instances are specialization-time values: they may be passed to a kernel as non-tensor
arguments even when `dataclass(eq=True)` made them unhashable.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

_MISSING = object()


def _is_field_value(name: str, value: Any) -> bool:
    if name.startswith("__") and name.endswith("__"):
        return False
    if isinstance(value, (staticmethod, classmethod, property)):
        return False
    if inspect.isfunction(value) or inspect.isclass(value) or inspect.ismethoddescriptor(value):
        return False
    return not callable(value) or isinstance(value, dataclasses.Field)


def _fields(cls: type) -> list[tuple[str, Any]]:
    """(name, default) of every field of `cls`, base classes first."""
    seen: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or klass is NKIObject:
            continue
        ns = vars(klass)
        keys = list(ns)
        order: dict[str, float] = {}
        last = -1.0
        for n in ns.get("__annotations__", {}):  # annotated-only names sit after the previous
            last = float(keys.index(n)) if n in ns else last + 1e-3
            order[n] = last
        for i, n in enumerate(keys):
            if n not in order and _is_field_value(n, ns[n]):
                order[n] = float(i)
        names = sorted(order, key=order.__getitem__)
        dc_fields = ns.get("__dataclass_fields__", {})
        for n in names:
            if n.startswith("__") and n.endswith("__"):
                continue
            value = ns.get(n, _MISSING)
            if n in dc_fields:
                f = dc_fields[n]
                value = f.default if f.default is not dataclasses.MISSING else f
            if isinstance(value, dataclasses.Field):
                value = value.default if value.default is not dataclasses.MISSING else value
            seen.pop(n, None)
            seen[n] = value
    return list(seen.items())


def _default(value: Any) -> Any:
    if isinstance(value, dataclasses.Field):
        if value.default_factory is not dataclasses.MISSING:
            return value.default_factory()
        return _MISSING
    return value


def _generated_init(self: Any, *args: Any, **kwargs: Any) -> None:
    cls = type(self)
    fields = _fields(cls)
    if len(args) > len(fields):
        raise TypeError(
            f"{cls.__name__}(): takes {len(fields)} field values; got {len(args)} positional"
        )
    names = [n for n, _ in fields]
    unknown = [k for k in kwargs if k not in names]
    if unknown:
        raise TypeError(f"{cls.__name__}(): unknown field(s) {unknown}; fields are {names}")
    for i, (name, default) in enumerate(fields):
        if i < len(args):
            if name in kwargs:
                raise TypeError(f"{cls.__name__}(): field {name!r} given twice")
            value = args[i]
        elif name in kwargs:
            value = kwargs[name]
        else:
            value = _default(default)
            if value is _MISSING:
                # AWS's kernels construct NKIObjects without their undefaulted fields
                # (bwmm_shard_on_I's DimensionSizes derives them after construction)
                value = None
        object.__setattr__(self, name, value)
    post = getattr(self, "__post_init__", None)
    if post is not None:
        post()


class NKIObject:
    """Base class of kernel-side objects; subclasses get a generated `__init__`."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        inherited = next(k.__dict__["__init__"] for k in cls.__mro__ if "__init__" in k.__dict__)
        if "__init__" not in vars(cls) and inherited in (object.__init__, _generated_init):
            # set before @dataclass runs, so dataclass keeps it (it never replaces an
            # __init__ the class body already has)
            cls.__init__ = _generated_init  # type: ignore[method-assign]

    def __repr__(self) -> str:
        parts = ", ".join(f"{n}={getattr(self, n, None)!r}" for n, _ in _fields(type(self)))
        return f"{type(self).__name__}({parts})"
