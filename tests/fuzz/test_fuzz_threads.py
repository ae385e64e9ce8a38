"""Property: ops called from several threads at once give exactly the serial results
(issue 31): every op family, forward and backward, CPU and the emulated neuron device."""

from __future__ import annotations

import concurrency as cc
from fuzz_support import DEVICES, count_case
from hypothesis import given, settings
from hypothesis import strategies as st


def test_eight_threads_times_two_hundred_mixed_calls_are_bit_identical_to_serial() -> None:
    # `make test`: 200 calls shared by 8 threads; `make fuzz`: 200 calls per thread
    n = 8 * 200 if settings.default.max_examples >= 100 else 200
    calls = cc.mixed_calls(n, DEVICES)
    want = cc.serial(calls)
    cc.assert_identical(cc.run_threaded(calls, threads=8), want, calls)


@st.composite
def thread_case(draw: st.DrawFn) -> dict:
    n = draw(st.integers(2, 8))
    return {
        "threads": draw(st.integers(2, 8)),
        "calls": [
            (
                draw(st.sampled_from(cc.KINDS)),
                draw(st.integers(0, 2)),
                draw(st.integers(0, 2**16)),
                draw(st.sampled_from(DEVICES)),
            )
            for _ in range(n)
        ],
    }


@given(thread_case())
def test_random_mixes_from_random_thread_counts_match_serial(c: dict) -> None:
    count_case("threads")
    calls = c["calls"]
    cc.assert_identical(cc.run_threaded(calls, c["threads"]), cc.serial(calls), calls)
