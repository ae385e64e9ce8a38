"""Shape buckets: the one function that maps a dynamic size to the static size a kernel sees.

The Neuron compiler takes static shapes only, so every op pads its dynamic dimension (rows,
tokens, sequence length) up to a bucket. `bucket(n, policy)` is used for everything keyed
by shape -- the compiled-kernel cache, config lookup, autotuning keys and test ids -- so
they always agree.

Default policy (`DEFAULT_POLICY`, `GeometricThenLinear()`):

* n <= 128            -> 128  (one partition tile: the floor)
* 128 < n <= 4096     -> the next power of two (256, 512, 1024, 2048, 4096)
* n > 4096            -> the next multiple of 1024 (5120, 6144, ..., 32768, ...)

Every bucket is a multiple of 128, so row tiles fill all partitions. Padding waste is at
most 2x in the power-of-two range (small, cheap problems) and at most 1024 / n above
4096 (25% at 4097, 3% at 32K); up to 32K tokens there are 34 buckets, i.e. 34 compiles
per op and dtype. Ops may pick their own `GeometricThenLinear(...)` parameters, and users
can pass any `BucketPolicy` -- for instance `ExplicitBuckets` with boundaries chosen from
a length distribution by the bucket optimizer.

Which policy a call uses (first that applies):

1. the call's own `bucket_policy=` argument (every `torch.ops.nki.*` op takes one: a
   policy spec string, see `parse_policy`);
2. the policy set for that op, `set_bucket_policy(policy, op="rms_norm")` (a backward
   op uses its forward op's: `rms_norm_backward` -> `rms_norm`);
3. the global policy, `set_bucket_policy(policy)`;
4. the policy file named by `$NKI_KERNELS_BUCKET_POLICY` (read once, on first use), as
   written by `nki-kernels buckets --write-policy FILE`: a default and per-op policies;
5. `DEFAULT_POLICY`.

Inside an op call the resolved policy is the *current* one (`current_policy()`), so
`bucket(n)` and `pad_to_bucket(x)` without an explicit policy follow it; the kernel cache
(keyed by the padded shapes) and config lookup (keyed by the bucketed problem) follow.
"""

from __future__ import annotations

import abc
import bisect
import contextlib
import contextvars
import itertools
import json
import os
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class BucketOverflow(ValueError):
    """A size is larger than the policy's largest bucket."""


class BucketPolicy(abc.ABC):
    """Maps a size n >= 1 to the smallest bucket >= n."""

    @abc.abstractmethod
    def bucket(self, n: int) -> int:
        """The bucket holding size `n` (>= n)."""

    @abc.abstractmethod
    def buckets(self, up_to: int) -> tuple[int, ...]:
        """Every bucket that a size <= `up_to` can map to, ascending."""

    def name(self) -> str:
        """A short stable description (used in config-store provenance and logs)."""
        return repr(self)


def _check_int(arg: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{arg}: expected an int; got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{arg}: expected an int >= {minimum}; got {value}")
    return value


@dataclass(frozen=True)
class GeometricThenLinear(BucketPolicy):
    """Powers of two from `minimum` up to `linear_from`, then multiples of `step`.

    `minimum` and `linear_from` are powers of two with minimum <= linear_from; `step`
    divides `linear_from`; `maximum` (optional) is the largest size accepted.
    """

    minimum: int = 128
    linear_from: int = 4096
    step: int = 1024
    maximum: int | None = None

    def __post_init__(self) -> None:
        for arg in ("minimum", "linear_from", "step"):
            v = _check_int(arg, getattr(self, arg), 1)
            if arg != "step" and v & (v - 1):
                raise ValueError(f"{arg}: expected a power of two; got {v}")
        if self.linear_from < self.minimum:
            raise ValueError(
                f"linear_from: expected >= minimum ({self.minimum}); got {self.linear_from}"
            )
        if self.linear_from % self.step:
            raise ValueError(
                f"step: expected a divisor of linear_from ({self.linear_from}); got {self.step}"
            )
        if self.maximum is not None:
            _check_int("maximum", self.maximum, self.minimum)

    def bucket(self, n: int) -> int:
        _check_int("n", n, 1)
        if self.maximum is not None and n > self.maximum:
            raise BucketOverflow(
                f"n: expected a size <= {self.maximum} (the largest bucket of {self.name()}); "
                f"got {n}"
            )
        if n <= self.minimum:
            return self.minimum
        if n <= self.linear_from:
            return 1 << (n - 1).bit_length()
        return -(-n // self.step) * self.step

    def buckets(self, up_to: int) -> tuple[int, ...]:
        _check_int("up_to", up_to, 1)
        top = self.bucket(up_to)
        out = []
        b = self.minimum
        while b <= min(top, self.linear_from):
            out.append(b)
            b *= 2
        b = self.linear_from + self.step
        while b <= top:
            out.append(b)
            b += self.step
        return tuple(out)

    def name(self) -> str:
        top = "" if self.maximum is None else f",max={self.maximum}"
        return f"pow2[{self.minimum}..{self.linear_from}]+{self.step}k{top}"


@dataclass(frozen=True)
class ExplicitBuckets(BucketPolicy):
    """Buckets are exactly `boundaries` (ascending); sizes above the last one overflow."""

    boundaries: tuple[int, ...]

    def __post_init__(self) -> None:
        b = tuple(self.boundaries)
        if not b:
            raise ValueError("boundaries: expected at least one bucket; got ()")
        for v in b:
            _check_int("boundaries", v, 1)
        if any(x >= y for x, y in itertools.pairwise(b)):
            raise ValueError(f"boundaries: expected strictly ascending sizes; got {b}")
        object.__setattr__(self, "boundaries", b)

    def bucket(self, n: int) -> int:
        _check_int("n", n, 1)
        i = bisect.bisect_left(self.boundaries, n)
        if i == len(self.boundaries):
            raise BucketOverflow(
                f"n: expected a size <= {self.boundaries[-1]} (the largest bucket of "
                f"{self.name()}); got {n}"
            )
        return self.boundaries[i]

    def buckets(self, up_to: int) -> tuple[int, ...]:
        _check_int("up_to", up_to, 1)
        top = self.bucket(up_to)
        return tuple(b for b in self.boundaries if b <= top)

    def name(self) -> str:
        return "explicit[" + ",".join(str(b) for b in self.boundaries) + "]"


DEFAULT_POLICY: BucketPolicy = GeometricThenLinear()
POLICY_ENV_VAR = "NKI_KERNELS_BUCKET_POLICY"
POLICY_FILE_FORMAT = 1

_POW2 = re.compile(r"^pow2\[(\d+)\.\.(\d+)\]\+(\d+)k?(?:,max=(\d+))?$")
_EXPLICIT = re.compile(r"^explicit\[([\d,\s]+)\]$")


def parse_policy(spec: str | BucketPolicy) -> BucketPolicy:
    """A policy from its spec string (what `BucketPolicy.name()` prints).

    Accepted: `"default"`; `"pow2[128..4096]+1024"` (optionally `,max=N`), i.e.
    `GeometricThenLinear(minimum, linear_from, step, maximum)`; `"explicit[384,1408,4096]"`
    or just `"384,1408,4096"`, i.e. `ExplicitBuckets`. A `BucketPolicy` is returned as is.
    """
    if isinstance(spec, BucketPolicy):
        return spec
    if not isinstance(spec, str):
        raise TypeError(
            f"bucket_policy: expected a BucketPolicy or a spec string; got {type(spec).__name__}"
        )
    text = spec.strip().replace(" ", "")
    if text == "default":
        return DEFAULT_POLICY
    m = _POW2.match(text)
    if m:
        lo, lin, step, top = m.groups()
        return GeometricThenLinear(int(lo), int(lin), int(step), int(top) if top else None)
    m = _EXPLICIT.match(text)
    body = m.group(1) if m else text
    if re.fullmatch(r"\d+(,\d+)*,?", body):
        return ExplicitBuckets(tuple(int(v) for v in body.split(",") if v))
    raise ValueError(
        "bucket_policy: expected 'default', 'pow2[MIN..LINEAR_FROM]+STEP[,max=N]', "
        f"'explicit[B1,B2,...]' or 'B1,B2,...'; got {spec!r}"
    )


@dataclass(frozen=True)
class PolicySettings:
    """A global policy (None: DEFAULT_POLICY) and per-op policies, as a policy file holds."""

    default: BucketPolicy | None = None
    ops: Mapping[str, BucketPolicy] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", dict(self.ops or {}))

    def for_op(self, op: str | None) -> BucketPolicy | None:
        """The policy set for `op` (or its forward op), else the default, else None."""
        ops = self.ops or {}
        if op is not None:
            for name in (op, op.removesuffix("_backward"), op.removesuffix("_bwd")):
                if name in ops:
                    return ops[name]
        return self.default

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of a policy file."""
        return {
            "format": POLICY_FILE_FORMAT,
            "default": None if self.default is None else self.default.name(),
            "ops": {k: v.name() for k, v in sorted((self.ops or {}).items())},
        }


def load_policy_file(path: str | os.PathLike[str]) -> PolicySettings:
    """Read a policy file (JSON: format, default, ops); ValueError naming file and field."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"bucket policy file {path}: cannot be read ({e})") from None
    if not isinstance(data, dict) or data.get("format") != POLICY_FILE_FORMAT:
        raise ValueError(
            f"bucket policy file {path}: expected a JSON object with format "
            f"{POLICY_FILE_FORMAT}; got {str(data)[:80]!r}"
        )
    ops = data.get("ops") or {}
    if not isinstance(ops, dict):
        raise ValueError(f"bucket policy file {path}: field 'ops': expected an object")
    try:
        default = None if data.get("default") is None else parse_policy(data["default"])
        parsed = {str(k): parse_policy(v) for k, v in ops.items()}
    except (TypeError, ValueError) as e:
        raise ValueError(f"bucket policy file {path}: {e}") from None
    return PolicySettings(default, parsed)


def write_policy_file(
    path: str | os.PathLike[str], policy: BucketPolicy, op: str | None = None
) -> PolicySettings:
    """Merge `policy` (for `op`, or as the default) into the policy file at `path`
    (atomically, under a lock on its directory: concurrent writers keep each other's ops)."""
    from .atomic_files import dir_lock, write_text_atomic

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with dir_lock(p.parent):
        current = load_policy_file(p) if p.exists() else PolicySettings()
        ops = dict(current.ops or {})
        default = current.default
        if op is None:
            default = policy
        else:
            ops[op] = policy
        out = PolicySettings(default, ops)
        write_text_atomic(p, json.dumps(out.to_dict(), indent=1) + "\n")
    return out


_lock = threading.Lock()
_settings: PolicySettings | None = None
_CURRENT: contextvars.ContextVar[BucketPolicy | None] = contextvars.ContextVar(
    "nki_bucket_policy", default=None
)


def _settings_locked() -> PolicySettings:
    """The settings, read from the env policy file on first use; the caller holds _lock."""
    global _settings
    if _settings is None:
        path = os.environ.get(POLICY_ENV_VAR) or None
        _settings = load_policy_file(path) if path else PolicySettings()
    return _settings


def _global_settings() -> PolicySettings:
    with _lock:
        return _settings_locked()


def set_bucket_policy(policy: BucketPolicy | str | None, op: str | None = None) -> None:
    """Set the policy of `op` (or the global one); None removes it."""
    global _settings
    parsed = None if policy is None else parse_policy(policy)
    with _lock:  # read and replace under one lock: concurrent setters keep each other's
        current = _settings_locked()
        ops = dict(current.ops or {})
        default = current.default
        if op is None:
            default = parsed
        elif parsed is None:
            ops.pop(op, None)
        else:
            ops[op] = parsed
        _settings = PolicySettings(default, ops)


def reset_bucket_policies() -> None:
    """Forget every set policy; the env policy file is read again on next use."""
    global _settings
    with _lock:
        _settings = None


def policy_for(op: str | None, call: BucketPolicy | str | None = None) -> BucketPolicy:
    """The policy a call of `op` uses (see the module docstring for the order)."""
    if call is not None:
        return parse_policy(call)
    return _global_settings().for_op(op) or DEFAULT_POLICY


def current_policy() -> BucketPolicy:
    """The policy of the op call in progress, else the global one."""
    return _CURRENT.get() or policy_for(None)


@contextlib.contextmanager
def using_policy(policy: BucketPolicy) -> Iterator[None]:
    """Make `policy` the current one for the duration (what an op call does)."""
    token = _CURRENT.set(policy)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def bucket(n: int, policy: BucketPolicy | None = None) -> int:
    """The bucket (static size) for dynamic size `n` under `policy` (default: the current)."""
    return (policy or current_policy()).bucket(n)


def bucket_id(n: int, policy: BucketPolicy | None = None, prefix: str = "n") -> str:
    """A test / log id naming the bucket of `n`, e.g. 'n512'."""
    return f"{prefix}{bucket(n, policy)}"


__all__ = [
    "DEFAULT_POLICY",
    "POLICY_ENV_VAR",
    "BucketOverflow",
    "BucketPolicy",
    "ExplicitBuckets",
    "GeometricThenLinear",
    "PolicySettings",
    "bucket",
    "bucket_id",
    "current_policy",
    "load_policy_file",
    "parse_policy",
    "policy_for",
    "reset_bucket_policies",
    "set_bucket_policy",
    "using_policy",
    "write_policy_file",
]
