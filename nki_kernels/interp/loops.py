"""Device (run-time) loops and the virtual registers that drive them.

`nl.fori_loop`, `nl.while_loop`, the deprecated `nl.dynamic_range` and bare
`while reg:`, and `nisa.register_alloc / register_move / register_load /
register_store`. The interpreter runs every iteration eagerly and in order, so the
body's instructions are traced once per iteration; each evaluation of a loop condition
is recorded as a `sync.loop_branch` record (register instructions as `sync.register_*`):
sequencer work, not one of the compute engines.

A `VirtualRegister` holds a run-time value the kernel's Python never sees. It may be
used as a loop bound, a while-loop condition, a `.ap(scalar_offset=reg)` index, and
as an operand of the `register_*` instructions. Using it as a Python number (`int(r)`,
`r + 1`, `range(r)`, `r < n`, indexing) is a meta-language violation the compiler
rejects: the interpreter raises rule REGISTER. In trace-only mode a register loaded
from memory has no known value, so a loop it controls raises rule LOOP.
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from . import dtypes as dt
from .engine import emit, read, write
from .errors import NkiValidationError, fail
from .state import current
from .tensor import NkiTensor, psum

MAX_ITERATIONS = 1_000_000  # a device loop running longer than this is taken as a hang
_INT32 = (-(2**31), 2**32 - 1)  # registers are 32-bit; accept int32 and uint32 values
_ids = itertools.count(1)
_block_ids = itertools.count(1)


class RegisterUseError(NkiValidationError, TypeError):
    """A register's run-time value was used as a Python value (the real tracer raises
    TypeError here; this error is both)."""


def _meta_violation(what: str) -> RegisterUseError:
    return RegisterUseError(
        "REGISTER",
        f"{what}: a VirtualRegister holds a run-time value that kernel Python cannot use; "
        "use it as a loop bound, a while_loop condition, .ap(scalar_offset=reg), or "
        "register_store it to a tensor and compute with ISA instructions",
    )


class VirtualRegister:
    """A 32-bit sequencer register (`nisa.register_alloc`). Frozen registers (a
    `fori_loop` / `dynamic_range` induction value) refuse register_move / register_load."""

    __slots__ = ("_value", "frozen", "rid")

    def __init__(self, state: int | None = None, frozen: bool = False) -> None:
        self.rid = next(_ids)
        self._value = state
        self.frozen = frozen

    @property
    def value(self) -> int | None:
        """The run-time value (None in trace-only mode when it came from memory)."""
        if self._value is None and not current().trace_only:
            raise fail("REGISTER", f"register r{self.rid} is read before it was written")
        return self._value

    def __repr__(self) -> str:
        kind = "read-only " if self.frozen else ""
        return f"<{kind}VirtualRegister r{self.rid}>"

    def __bool__(self) -> bool:
        _deprecated("while_reg", "`while reg:` is deprecated; use nl.while_loop(reg, body)")
        if current().trace_only and self._value is None:
            raise _unknown("while reg:")
        taken = self.value != 0
        _branch("while_reg", taken)
        return taken

    def __index__(self) -> int:
        raise _meta_violation("using a register as a Python int")

    def __int__(self) -> int:
        raise _meta_violation("int(register)")

    def __float__(self) -> float:
        raise _meta_violation("float(register)")

    def _arith(self, *_: Any) -> Any:
        raise _meta_violation("Python arithmetic or comparison on a register")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _arith
    __floordiv__ = __rfloordiv__ = __truediv__ = __rtruediv__ = __mod__ = __rmod__ = _arith
    __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = __neg__ = _arith
    __hash__ = object.__hash__


def _deprecated(key: str, message: str) -> None:
    launch = current()
    if key not in launch.warned:
        launch.warned.add(key)
        warnings.warn(message, DeprecationWarning, stacklevel=3)


def _unknown(where: str) -> Any:
    return fail(
        "LOOP",
        f"{where}: the trip count depends on a register loaded from memory, which has no "
        "value in trace-only mode; run numerically or give compile-time bounds",
    )


def _branch(kind: str, taken: bool) -> None:
    emit("sync", "loop_branch", (), (), 1, 1, attrs={"loop": kind, "taken": taken})


def _check_not_in_no_reorder(what: str) -> None:
    if current().program.no_reorder_depth:
        raise fail("LOOP", f"{what} cannot be used inside `with nl.no_reorder():`")


@contextlib.contextmanager
def no_reorder() -> Iterator[None]:
    """`with nl.no_reorder():` -- the interpreter already runs in program order; device
    loops are refused inside the block (a compiler rule). The instructions traced in the
    block carry its id (`Instr.no_reorder`; a nested block is part of the outer one) so
    the cost model's instruction scheduling keeps them in program order."""
    prog = current().program
    outer = prog.no_reorder_block
    if not outer:
        prog.no_reorder_block = next(_block_ids)
    prog.no_reorder_depth += 1
    try:
        yield
    finally:
        prog.no_reorder_depth -= 1
        prog.no_reorder_block = outer


# ---- register instructions ------------------------------------------------------------
def _register(x: Any, arg: str, instr: str, *, writable: bool = False) -> VirtualRegister:
    if not isinstance(x, VirtualRegister):
        raise fail("REGISTER", f"{instr}: {arg} must be a VirtualRegister; got {type(x).__name__}")
    if writable and x.frozen:
        raise fail(
            "REGISTER",
            f"{instr}: {arg} {x!r} is a loop induction register and is read-only "
            "(writing it would not change the loop)",
        )
    return x


def _immediate(x: Any, arg: str, instr: str) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise fail("REGISTER", f"{instr}: {arg} must be an int or a VirtualRegister; got {x!r}")
    if not _INT32[0] <= int(x) <= _INT32[1]:
        raise fail("REGISTER", f"{instr}: {arg}={int(x)} does not fit a 32-bit register")
    return int(x)


def _scalar_tensor(t: Any, arg: str, instr: str) -> NkiTensor:
    if not isinstance(t, NkiTensor):
        raise fail("ARG", f"{instr}: {arg} must be an NKI tensor; got {type(t).__name__}")
    if t.size != 1:
        raise fail("REGISTER", f"{instr}: {arg} must hold exactly one element; got shape {t.shape}")
    if t.buffer is psum:
        raise fail("BUF", f"{instr}: {arg} must be in SBUF or HBM; got PSUM ('{t.name}')")
    if not dt.is_int(t.dtype) or t.dtype._size > 4:
        raise fail("DTYPE", f"{instr}: {arg} must be a 32-bit or narrower integer; got {t.dtype}")
    return t


def register_alloc(x: Any = None) -> VirtualRegister:
    """A new register: uninitialized (None), an int immediate, or loaded from a
    one-element integer tensor (as nki-library passes)."""
    if x is None:
        return VirtualRegister(None)
    if isinstance(x, NkiTensor):
        reg = VirtualRegister(None)
        register_load(reg, x)
        return reg
    return VirtualRegister(_immediate(x, "x", "register_alloc"))


def register_move(dst: Any, src: Any) -> None:
    """dst = src (an int immediate or another register)."""
    instr = "register_move"
    reg = _register(dst, "dst", instr, writable=True)
    if isinstance(src, VirtualRegister):
        value = src.value
    else:
        value = _immediate(src, "src", instr)
    emit("sync", instr, (), (), 1, 1)
    reg._value = value


def register_load(dst: Any, src: Any) -> None:
    """dst = the single integer element of `src` (SBUF or HBM)."""
    instr = "register_load"
    reg = _register(dst, "dst", instr, writable=True)
    t = _scalar_tensor(src, "src", instr)
    emit("sync", instr, (), (t,), 1, 1)
    reg._value = None if current().trace_only else int(read(t).reshape(-1)[0])


def register_store(dst: Any, src: Any) -> None:
    """Write the register's value into the single element of `dst` (SBUF or HBM)."""
    instr = "register_store"
    t = _scalar_tensor(dst, "dst", instr)
    reg = _register(src, "src", instr)
    emit("sync", instr, (t,), (), 1, 1)
    if current().trace_only:
        return
    write(t, np.array(reg.value, dtype=np.int64).reshape(t.shape))


# ---- loops ----------------------------------------------------------------------------
def _bound(x: Any, arg: str, where: str) -> int:
    if isinstance(x, VirtualRegister):
        if current().trace_only and x._value is None:
            raise _unknown(where)
        v = x.value
        assert v is not None
        return v
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise fail(
            "LOOP", f"{where}: {arg} must be an int or a VirtualRegister; got {type(x).__name__}"
        )
    return int(x)


def _step(step: Any, where: str) -> int:
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step <= 0:
        raise fail("LOOP", f"{where}: step must be a positive compile-time int; got {step!r}")
    return int(step)


def _trip_range(lo: int, hi: int, step: int, where: str) -> range:
    r = range(lo, hi, step)
    if len(r) > MAX_ITERATIONS:
        raise fail(
            "LOOP", f"{where}: {len(r)} iterations exceed the interpreter's {MAX_ITERATIONS}"
        )
    return r


def fori_loop(lower: Any, upper: Any, body_fun: Callable[[Any], Any], step: Any = 1) -> None:
    """Run body_fun(i) for i in range(lower, upper, step); `i` is a read-only register.

    lower / upper are ints or registers; step is a positive compile-time int. The body
    returns None and keeps its state in SBUF / HBM.
    """
    where = "nl.fori_loop"
    _check_not_in_no_reorder(where)
    if not callable(body_fun):
        raise fail("LOOP", f"{where}: body_fun must be callable; got {body_fun!r}")
    s = _step(step, where)
    trips = _trip_range(_bound(lower, "lower", where), _bound(upper, "upper", where), s, where)
    for v in trips:
        _branch("fori", True)
        ret = body_fun(VirtualRegister(v, frozen=True))
        if ret is not None and not hasattr(ret, "depends_on"):  # an ISA handle is fine
            raise fail(
                "LOOP",
                f"{where}: body_fun must return None (loop state lives in SBUF / HBM); "
                f"got {type(ret).__name__}",
            )
    _branch("fori", False)


def while_loop(init: Any, body_fun: Callable[[Any], Any]) -> None:
    """`r = init; while r != 0: r = body_fun(r)` -- the body gets a copy of the condition
    register and returns the register holding the next condition."""
    where = "nl.while_loop"
    _check_not_in_no_reorder(where)
    if not isinstance(init, VirtualRegister):
        raise fail("LOOP", f"{where}: init must be a VirtualRegister; got {type(init).__name__}")
    if not callable(body_fun):
        raise fail("LOOP", f"{where}: body_fun must be callable; got {body_fun!r}")
    cond = init
    for _ in range(MAX_ITERATIONS + 1):
        if current().trace_only and cond._value is None:
            raise _unknown(where)
        taken = cond.value != 0
        _branch("while", taken)
        if not taken:
            return
        cond = body_fun(VirtualRegister(cond.value))
        if not isinstance(cond, VirtualRegister):
            raise fail(
                "LOOP",
                f"{where}: body_fun must return the condition VirtualRegister; got "
                f"{type(cond).__name__}",
            )
    raise fail("LOOP", f"{where}: still running after {MAX_ITERATIONS} iterations")


def dynamic_range(start: Any, stop: Any = None, step: Any = 1) -> Iterator[VirtualRegister]:
    """Deprecated: `for i in nl.dynamic_range(start, stop, step)` over read-only
    registers; use nl.fori_loop."""
    where = "nl.dynamic_range"
    _deprecated("dynamic_range", "nl.dynamic_range is deprecated; use nl.fori_loop")
    _check_not_in_no_reorder(where)
    if stop is None:
        start, stop = 0, start
    s = _step(step, where)
    trips = _trip_range(_bound(start, "start", where), _bound(stop, "stop", where), s, where)
    return _iterate(trips)


def _iterate(trips: range) -> Iterator[VirtualRegister]:
    for v in trips:
        _branch("dynamic_range", True)
        yield VirtualRegister(v, frozen=True)
    _branch("dynamic_range", False)
