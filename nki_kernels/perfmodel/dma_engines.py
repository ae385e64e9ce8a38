"""The 16 DMA engines of one core, grouped while they are in the same state.

Each engine has a busy-until time and the recent idle gaps before it; a transfer takes
the earliest idle gap at or after its start time that fits, else queues behind the
engine's busy run (so a load that is ready early can slip in before a store queued
earlier that waited for its data, as round-robin service of several queues allows).

Most transfers span all 128 partitions and hence all 16 engines with equal shares, so
the engines are kept as contiguous *segments* of engines in identical state: a
transfer updates each segment it covers once. A transfer over part of a segment splits
it; neighbouring segments whose states become equal again are merged.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

KEEP_GAPS = 32  # idle gaps remembered per engine; older ones can no longer be filled


class _Lane:
    """State shared by every engine of one segment."""

    __slots__ = ("busy", "gap_ends", "gap_starts", "last")

    def __init__(self) -> None:
        self.last = 0.0
        self.busy = 0.0
        self.gap_starts: list[float] = []
        self.gap_ends: list[float] = []

    def clone(self) -> _Lane:
        c = _Lane()
        c.last, c.busy = self.last, self.busy
        c.gap_starts, c.gap_ends = list(self.gap_starts), list(self.gap_ends)
        return c

    def same(self, other: _Lane) -> bool:
        return (
            self.last == other.last
            and self.busy == other.busy
            and self.gap_ends == other.gap_ends
            and self.gap_starts == other.gap_starts
        )

    def take(self, t0: float, dur: float) -> float:
        """Reserve `dur` ns at the earliest possible time >= t0; return the start."""
        last = self.last
        self.busy += dur
        if t0 >= last:  # idle: the gap [last, t0) stays open for later transfers
            if t0 > last:
                self.gap_starts.append(last)
                self.gap_ends.append(t0)
                if len(self.gap_ends) > KEEP_GAPS:
                    del self.gap_starts[0], self.gap_ends[0]
            self.last = t0 + dur
            return t0
        ge = self.gap_ends
        if ge and ge[-1] > t0:
            s = fill_gap(self.gap_starts, ge, t0, dur)
            if s >= 0.0:
                return s
        self.last = last + dur
        return last


def fill_gap(gap_starts: list[float], gap_ends: list[float], t0: float, dur: float) -> float:
    """Start of a `dur`-long transfer in the earliest gap at or after `t0`, or -1.

    The gaps are disjoint and sorted; the one used is split or consumed in place.
    """
    for j in range(bisect_right(gap_ends, t0), len(gap_ends)):
        gs, ge = gap_starts[j], gap_ends[j]
        start = gs if gs > t0 else t0
        if ge - start >= dur:
            end = start + dur
            if start > gs and end < ge:
                gap_ends[j] = start
                gap_starts.insert(j + 1, end)
                gap_ends.insert(j + 1, ge)
            elif start > gs:
                gap_ends[j] = start
            elif end < ge:
                gap_starts[j] = end
            else:
                del gap_starts[j], gap_ends[j]
            return start
    return -1.0


class DmaEngines:
    """The DMA engines of one core (see the module docstring)."""

    __slots__ = ("bounds", "lanes", "n")

    def __init__(self, n: int) -> None:
        self.n = n
        self.bounds = [0, n]  # segment i covers engines [bounds[i], bounds[i + 1])
        self.lanes = [_Lane()]

    def _cut(self, x: int) -> int:
        """Make engine index `x` a segment boundary; return the boundary's index."""
        b = self.bounds
        i = bisect_left(b, x)
        if b[i] != x:
            b.insert(i, x)
            self.lanes.insert(i, self.lanes[i - 1].clone())
        return i

    def transfer(
        self, first: int, stop: int, t0: float, dur: float
    ) -> list[tuple[int, int, float]]:
        """Engines [first, stop) each move a `dur`-long share, starting no earlier than t0.

        Returns (engine_lo, engine_hi, start) per segment of engines that start together.
        """
        lo = self._cut(first)
        hi = self._cut(stop)
        lanes, b = self.lanes, self.bounds
        out = [(b[j], b[j + 1], lanes[j].take(t0, dur)) for j in range(lo, hi)]
        if hi - lo > 1 or lo > 0 or hi < len(lanes):
            self._merge(max(lo - 1, 0), min(hi + 1, len(lanes)))
        return out

    def _merge(self, lo: int, hi: int) -> None:
        lanes, b = self.lanes, self.bounds
        j = lo
        while j + 1 < hi and j + 1 < len(lanes):
            if lanes[j].same(lanes[j + 1]):
                del lanes[j + 1], b[j + 1]
                hi -= 1
            else:
                j += 1

    def busy(self) -> list[float]:
        """Busy ns per engine."""
        out = []
        for j, lane in enumerate(self.lanes):
            out.extend([lane.busy] * (self.bounds[j + 1] - self.bounds[j]))
        return out
