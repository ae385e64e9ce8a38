"""Errors raised by the interpreter when a kernel breaks a compiler or hardware rule."""

from __future__ import annotations

from typing import Any


class NkiValidationError(Exception):
    """A kernel broke a rule the NKI compiler or the hardware enforces.

    `rule` is a short stable identifier (for example "TC1" for the partition-dimension
    limit); the message always names the rule and the numbers involved.
    """

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"{message} (rule {rule})")
        self.rule = rule


class MemoryPlanError(NkiValidationError):
    """An allocation does not fit in the target's SBUF or PSUM."""


class DtypeError(NkiValidationError, TypeError):
    """A dtype that is not an NKI dtype (rule DTYPE; also a TypeError, like NumPy's)."""


class NotSupportedError(NkiValidationError):
    """A documented NKI name the interpreter does not implement (rule UNSUPPORTED).

    Not an AttributeError on purpose: `from nki.language import X` then reports this
    message instead of a bare "cannot import name".
    """


def not_supported(name: str, detail: str = "") -> NotSupportedError:
    """The error for a documented name the interpreter does not implement."""
    extra = f" ({detail})" if detail else ""
    return NotSupportedError(
        "UNSUPPORTED", f"{name} is documented NKI but not supported by the interpreter{extra}"
    )


def unsupported_getattr(module: str, names: dict[str, str]) -> Any:
    """A module `__getattr__` raising NotSupportedError for the documented names in `names`."""

    def __getattr__(attr: str) -> Any:
        if attr in names:
            raise not_supported(f"{module}.{attr}", names[attr])
        raise AttributeError(f"module {module!r} has no attribute {attr!r}")

    return __getattr__


def fail(rule: str, message: str) -> NkiValidationError:
    """Build the error for `rule`; callers write `raise fail(...)`."""
    return NkiValidationError(rule, message)


# The rules the interpreter enforces, with the identifier each error carries.
RULES: dict[str, str] = {
    "TC1": "an on-chip tensor's partition dimension is at most 128",
    "IDX": "indexes and slices stay inside the tensor",
    "VIEW": "view operations keep their documented invariants",
    "BUF": "the operand lives in a buffer this instruction can access",
    "PART": "operands of one instruction use the same number of partitions",
    "FREE": "operands of one instruction hold the same number of elements per partition",
    "DTYPE": "operand dtypes are legal for the instruction",
    "DTYPE_STR": "NKI dtypes are strings compared by value (no NumPy dtype attributes)",
    "MM_K": "matmul contraction (partition) size K is at most 128",
    "MM_M": "matmul stationary free size M is at most 128",
    "MM_N": "matmul moving free size N is at most 512 (NC-v4: 4096 fp32 / 8192 bf16 dst)",
    "MM_SHAPE": "matmul operand and destination shapes agree",
    "MM_BANK": "a matmul destination stays within one 2 KiB PSUM bank (before NC-v4)",
    "DMA_PSUM": "DMA never reads or writes PSUM",
    "DMA_COUNT": "DMA source and destination hold the same number of elements",
    "DMA_OOB": "an indirect DMA row lies inside its tensor (oob_mode.skip drops it instead)",
    "TRANSPOSE": "transpose sizes are within the engine's limit",
    "REDUCE_AXIS": "reductions run over the trailing free dimensions only",
    "MEMSET_KIND": "a memset value's kind matches the destination dtype",
    "MEMSET_X4": "a memset into a packed MX (*_x4) tile writes value=0",
    "DTYPE_X4": "packed MX (*_x4) operands only in equal-dtype copies and the MX instructions",
    "MX_SHAPE": "MX tiles span a multiple of 32 partitions (<= 128), 4 values per x4 element",
    "MX_SCALE": "MX scales sit in their group's SBUF quadrant, at quadrant offset 0/4/8/12",
    "GPSIMD_PSUM": "GpSimd cannot access PSUM",
    "ENGINE": "the instruction runs on an engine that supports it",
    "VERSION": "the instruction or mode exists on this NeuronCore version",
    "KWARG": "only documented keyword arguments are accepted",
    "OP": "the op token is legal for this instruction",
    "ARG": "an argument has the documented type and range",
    "SBUF_OVERFLOW": "live SBUF allocations fit in the target's usable SBUF",
    "PSUM_OVERFLOW": "live PSUM allocations fit in 8 banks of 2 KiB",
    "LAUNCH": "kernel launch arguments follow the nki.jit rules",
    "LOOP": "device loops follow the fori_loop / while_loop rules",
    "REGISTER": "a VirtualRegister is used only as a loop bound, a scalar_offset or by register_*",
    "TOPK_SIZE": "max8 / nc_find_index8 / nc_match_replace8 read 8..16384 elements per partition",
    "BN_SIZE": "bn_stats reads <= 512 elements per partition, writes 6; bn_aggr reads 3k, writes 2",
    "RANGE_FILL": "range_select's on_false_value is FP32_MIN (-3.4028235e38)",
    "ACC_CMD": "the reduce_cmd is one the instruction supports (load_reduce needs reduce_init)",
    "NL_API": "the experimental nl compute wrappers are used in their supported forms",
    "LANGUAGE": "kernel code stays inside the NKI language subset (checked at nki.jit time)",
    "SYNC": "LNC programs meet at core_barrier / sendrecv, ranks at collectives (no unmet waits)",
    "COLLECTIVE": "nki.collectives calls follow their documented restrictions",
    "UNSUPPORTED": "a documented NKI name the interpreter does not implement (README list)",
    "NL_SHAPE": "nl compute wrappers take operands of one shape (they do not broadcast)",
}
