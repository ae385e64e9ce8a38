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
"""

from __future__ import annotations

import abc
import bisect
import itertools
from dataclasses import dataclass


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


def bucket(n: int, policy: BucketPolicy | None = None) -> int:
    """The bucket (static size) for dynamic size `n` under `policy` (default: DEFAULT_POLICY)."""
    return (policy or DEFAULT_POLICY).bucket(n)


def bucket_id(n: int, policy: BucketPolicy | None = None, prefix: str = "n") -> str:
    """A test / log id naming the bucket of `n`, e.g. 'n512'."""
    return f"{prefix}{bucket(n, policy)}"


__all__ = [
    "DEFAULT_POLICY",
    "BucketOverflow",
    "BucketPolicy",
    "ExplicitBuckets",
    "GeometricThenLinear",
    "bucket",
    "bucket_id",
]
