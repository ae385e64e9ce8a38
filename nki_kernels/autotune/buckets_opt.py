"""Bucket-boundary optimizer: which static sizes to compile for a length distribution.

Every op pads its dynamic size (sequence length, token count) up to a bucket, so a bucket
set is a trade between compiled variants and padding waste. Given observed lengths
(with counts) and at most K buckets, `optimize` returns the boundaries minimizing the
expected modeled time per call,

    E[t] = sum_l p(l) * t(bucket(l)),   bucket(l) = smallest boundary >= l,

where `t(b)` is the op's modeled time at static size b (the padding waste is priced by
it). The optimum is exact over a candidate set: dynamic programming over the sorted
candidates c_1 < ... < c_m,

    best[k][i] = min_{j < i} best[k-1][j] + (P[i] - P[j]) * t(c_i),   best[1][i] = P[i] t(c_i)

with P[i] = number of lengths <= c_i, O(K m^2) time. Candidates are every observed length
rounded up to `align`, plus the default policy's and the powers of two's boundaries in
range: for any t, the result is at least as good as any bucket set drawn from them with
the same number of buckets, and when t is nondecreasing a boundary can always move down
to the largest observed length below it, so the observed lengths alone are already
optimal over all integers.

The DP keeps an m x m table, so candidates are capped at MAX_CANDIDATES. When the
observed lengths at `align` give more, the alignment is coarsened (doubled until they
fit: align 1 -> 2 -> 4 ...): the result is then exact over the coarser grid, and the plan's
`note` says which alignment was used.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..runtime.buckets import DEFAULT_POLICY, BucketPolicy, ExplicitBuckets

CostFn = Callable[[int], float]
MAX_CANDIDATES = 3000


@dataclass(frozen=True)
class LengthDistribution:
    """Observed sizes: distinct ascending `lengths` with their `counts`."""

    lengths: tuple[int, ...]
    counts: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.lengths:
            raise ValueError("lengths: expected at least one observed length; got none")
        if len(self.lengths) != len(self.counts):
            raise ValueError("lengths and counts: expected equal sizes")
        if any(n < 1 for n in self.lengths):
            raise ValueError(f"lengths: expected sizes >= 1; got {min(self.lengths)}")
        if any(c < 0 for c in self.counts) or sum(self.counts) == 0:
            raise ValueError("counts: expected non-negative counts with a positive total")

    @classmethod
    def from_samples(cls, samples: Iterable[int]) -> LengthDistribution:
        values, counts = np.unique(np.asarray(list(samples), dtype=np.int64), return_counts=True)
        return cls(tuple(int(v) for v in values), tuple(int(c) for c in counts))

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[int, int]]) -> LengthDistribution:
        acc: dict[int, int] = {}
        for length, count in pairs:
            acc[int(length)] = acc.get(int(length), 0) + int(count)
        keys = sorted(acc)
        return cls(tuple(keys), tuple(acc[k] for k in keys))

    @classmethod
    def from_file(cls, path: str | Path) -> LengthDistribution:
        """Read one length per line, or `length count` / `length,count` pairs; '#' comments."""
        pairs = []
        for lineno, raw in enumerate(Path(path).read_text().splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            fields = [f for f in re.split(r"[,\s]+", line) if f]
            try:
                nums = [int(f) for f in fields]
            except ValueError:
                raise ValueError(
                    f"{path}:{lineno}: expected 'length' or 'length count' integers; got {raw!r}"
                ) from None
            if len(nums) == 1:
                pairs.append((nums[0], 1))
            elif len(nums) == 2:
                pairs.append((nums[0], nums[1]))
            else:
                raise ValueError(f"{path}:{lineno}: expected 1 or 2 integers; got {raw!r}")
        if not pairs:
            raise ValueError(f"{path}: no lengths found")
        return cls.from_pairs(pairs)

    @property
    def total(self) -> int:
        return sum(self.counts)

    @property
    def max_length(self) -> int:
        return self.lengths[-1]


@dataclass(frozen=True)
class BucketPlan:
    """A bucket set and what it costs on a distribution."""

    name: str
    boundaries: tuple[int, ...]  # only the buckets some observed length uses
    expected_time: float  # mean modeled time per call, in the cost function's unit
    padding_waste: float  # padded elements / real elements (0.25 = 25% extra)
    note: str = ""  # e.g. the coarsened alignment the optimum was computed on

    def policy(self) -> ExplicitBuckets:
        return ExplicitBuckets(self.boundaries)


def evaluate(
    dist: LengthDistribution, buckets: BucketPolicy | Sequence[int], cost: CostFn, name: str = ""
) -> BucketPlan:
    """Expected time and padding waste of a bucket set (a policy or a list of boundaries)."""
    policy = buckets if isinstance(buckets, BucketPolicy) else ExplicitBuckets(tuple(buckets))
    memo: dict[int, float] = {}
    used: set[int] = set()
    time_sum = 0.0
    padded = 0
    for length, count in zip(dist.lengths, dist.counts):
        b = policy.bucket(length)
        used.add(b)
        if b not in memo:
            memo[b] = float(cost(b))
        time_sum += count * memo[b]
        padded += count * (b - length)
    real = sum(n * c for n, c in zip(dist.lengths, dist.counts))
    label = name or policy.name()
    return BucketPlan(label, tuple(sorted(used)), time_sum / dist.total, padded / real)


def _round_up(n: int, align: int) -> int:
    return -(-n // align) * align


def candidates(
    dist: LengthDistribution, align: int = 1, extra: Iterable[int] = ()
) -> tuple[int, ...]:
    """Sorted candidate boundaries: observed lengths rounded up to `align`, plus `extra`
    values between the smallest candidate and the first one covering the largest length."""
    if align < 1:
        raise ValueError(f"align: expected an int >= 1; got {align}")
    base = {_round_up(n, align) for n in dist.lengths}
    top = max(base)
    lo = min(base)
    cands = base | {int(e) for e in extra if lo <= e and e % align == 0}
    # keep every candidate up to the first extra one covering the top
    above = sorted(c for c in cands if c > top)
    keep = {c for c in cands if c <= top} | set(above[:1])
    if len(keep) > MAX_CANDIDATES:
        raise ValueError(
            f"align: {len(keep)} candidate boundaries exceed {MAX_CANDIDATES}; "
            f"pass a larger alignment (got align={align})"
        )
    return tuple(sorted(keep))


def coarsened_candidates(
    dist: LengthDistribution, align: int = 1, extra: Iterable[int] = ()
) -> tuple[tuple[int, ...], int]:
    """(candidates, alignment used): `align` doubled until at most MAX_CANDIDATES remain."""
    if isinstance(align, bool) or not isinstance(align, int) or align < 1:
        raise ValueError(f"align: expected an int >= 1; got {align!r}")
    extra = list(extra)
    a = align
    while True:
        try:
            return candidates(dist, a, extra), a
        except ValueError:
            if a > dist.max_length:
                raise
            a *= 2  # too many candidates at this alignment: coarsen


def optimize(
    dist: LengthDistribution,
    max_buckets: int,
    cost: CostFn,
    align: int = 1,
    extra_candidates: Iterable[int] | None = None,
) -> BucketPlan:
    """The exact minimum-expected-time bucket set with at most `max_buckets` buckets."""
    if not isinstance(max_buckets, int) or max_buckets < 1:
        raise ValueError(f"max_buckets: expected an int >= 1; got {max_buckets!r}")
    if extra_candidates is None:
        extra_candidates = default_extra_candidates(dist)
    cand_list, used_align = coarsened_candidates(dist, align, extra_candidates)
    cands = np.asarray(cand_list, dtype=np.int64)
    m = len(cands)
    t = np.array([float(cost(int(c))) for c in cands])
    lengths = np.asarray(dist.lengths, dtype=np.int64)
    cum = np.concatenate([[0], np.cumsum(np.asarray(dist.counts, dtype=np.float64))])
    prefix = cum[np.searchsorted(lengths, cands, side="right")]  # P[i]: lengths <= c_i
    covers = cands >= dist.max_length
    inf = math.inf
    best = prefix * t  # one bucket ending at c_i
    parents: list[np.ndarray] = [np.full(m, -1)]
    answer = (best[covers].min(), 1)
    layers = [best]
    for k in range(2, min(max_buckets, m) + 1):
        # cand[j, i] = best[j] + (P[i] - P[j]) * t[i] for j < i
        cand = best[:, None] + (prefix[None, :] - prefix[:, None]) * t[None, :]
        cand[np.tril_indices(m)] = inf
        parent = np.argmin(cand, axis=0)
        best = cand[parent, np.arange(m)]
        parents.append(parent)
        layers.append(best)
        top = best[covers].min()
        if top < answer[0] - 1e-12 * abs(answer[0]):
            answer = (top, k)
    k = answer[1]
    layer = layers[k - 1]
    masked = np.where(covers, layer, inf)
    i = int(np.argmin(masked))
    chosen = []
    while i >= 0 and k >= 1:
        chosen.append(int(cands[i]))
        i = int(parents[k - 1][i])
        k -= 1
    plan = evaluate(dist, sorted(chosen), cost, name=f"optimal[{max_buckets}]")
    if used_align != align:
        note = (
            f"candidates coarsened to multiples of {used_align} (align {align} gives more "
            f"than {MAX_CANDIDATES}); the optimum is exact on that grid"
        )
        plan = BucketPlan(plan.name, plan.boundaries, plan.expected_time, plan.padding_waste, note)
    return plan


def default_extra_candidates(dist: LengthDistribution) -> list[int]:
    """Boundaries of the project's default policy and the powers of two, up to the max."""
    top = 1 << max(0, (dist.max_length - 1).bit_length())
    pows = [1 << e for e in range(top.bit_length())]
    try:
        dflt = list(DEFAULT_POLICY.buckets(dist.max_length))
    except ValueError:
        dflt = []
    return sorted(set(pows) | set(dflt))


def power_of_two_plan(dist: LengthDistribution, cost: CostFn, minimum: int = 1) -> BucketPlan:
    """Pure powers of two (from `minimum`) up to the first one covering the max length."""
    top = max(minimum, 1 << max(0, (dist.max_length - 1).bit_length()))
    bounds = []
    b = minimum
    while b <= top:
        bounds.append(b)
        b *= 2
    return evaluate(dist, bounds, cost, name=f"pow2[{minimum}..]")


def linear_cost(fixed: float = 0.0, per_element: float = 1.0) -> CostFn:
    """t(b) = fixed + per_element * b (memory-bound ops: norms, MoE token streams)."""
    return lambda b: fixed + per_element * b


def quadratic_cost(fixed: float = 0.0, linear: float = 0.0, quad: float = 1.0) -> CostFn:
    """t(b) = fixed + linear * b + quad * b^2 (attention over a padded sequence)."""
    return lambda b: fixed + linear * b + quad * b * b


def interpolated_cost(points: dict[int, float]) -> CostFn:
    """Piecewise-linear through priced (size, time) points, clamped-linear beyond them."""
    if len(points) < 2:
        raise ValueError(f"points: expected at least 2 priced sizes; got {len(points)}")
    xs = np.array(sorted(points), dtype=np.float64)
    ys = np.array([points[int(x)] for x in xs])

    def cost(b: int) -> float:
        if b <= xs[-1]:
            return float(np.interp(b, xs, ys))
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return float(ys[-1] + slope * (b - xs[-1]))

    return cost
