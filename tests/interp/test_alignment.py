"""SBUF placement alignment and the usable sizes, against what the public sources give.

leanprover/KLR @ 7ccd18c (Kernel Language Representation, "initial focus ... the Neuron
Kernel Interface"), KLR/Trace.lean, `kernelEnv`:
    const_int (.str (nl "tile_size") "psum_min_align") 4,
    const_int (.str (nl "tile_size") "sbuf_min_align") 1,
    | 2 => ... "total_available_sbuf_size") 180224]
    | 3 => ... "total_available_sbuf_size") 212984]
    | 4 => ... "total_available_sbuf_size") 245752]
(arch = `nisa.nc_version`: gen2 trn1, gen3 trn2, gen4 trn3). The API stubs (aws-neuron-sdk
81ce03ae, nki/api/nki/language/__init__.py) describe sbuf_min_align as the "Minimum byte
alignment requirement for SBUF free dimension address", with no value. KLR's access
patterns read a free offset as whole elements (KLR/Core/Tensor.lean: "We can't find
documentation that the free offset must be aligned by dtype size, but we think it's
probably the case"), and nki-library's SbufManager aligns each tile to its dtype size
unless told otherwise (d2ad3a57, core/utils/allocator.py, `alloc_stack`: `if align ==
None: align = sizeinbytes(dtype)`); its release notes fixed "tensor 4-byte alignment"
(aws-neuron-sdk release-notes/components/nki-lib.rst). The widest on-chip dtype is 4 B,
so 4-byte placement is legal for every tile.
"""

from __future__ import annotations

import pytest

from nki_kernels.interp import MemoryPlanError, nl, run, settings
from nki_kernels.interp.memory import SBUF_ALIGN, SBUF_MIN_ALIGN
from nki_kernels.targets import get_target


def test_usable_sbuf_is_the_front_ends_total_available_sbuf_size():
    assert get_target("trn1").sbuf_usable_bytes == 180224
    assert get_target("trn2").sbuf_usable_bytes == 212984
    assert get_target("trn3").sbuf_usable_bytes == 245752

    seen = {}

    def kernel():
        seen["sbuf"] = nl.tile_size.total_available_sbuf_size
        seen["align"] = (nl.tile_size.sbuf_min_align, nl.tile_size.psum_min_align)

    for name, size in (("trn1", 180224), ("trn2", 212984), ("trn3", 245752)):
        run(kernel, target=name)
        assert seen == {"sbuf": size, "align": (1, 4)}


def _small_tiles_kernel(extra_cols):
    usable = get_target("trn2").sbuf_usable_bytes
    n_small = 100  # [128, 1] fp32: 4 B per partition each, one 64 B granule each at 64 B
    big_cols = (usable - 4 * n_small) // 4 + extra_cols

    def kernel():
        live = [nl.ndarray((128, big_cols), nl.float32, buffer=nl.sbuf)]
        live += [nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf) for _ in range(n_small)]
        assert len(live) == n_small + 1

    return kernel


def test_a_plan_that_fits_only_at_the_documented_alignment_plans():
    assert SBUF_ALIGN == 64 and SBUF_MIN_ALIGN == 4
    usable = get_target("trn2").sbuf_usable_bytes
    # at 64 B the 100 small tiles take 6,400 B and the plan is 6,024 B short; placed at
    # 4-byte alignment it fills the usable SBUF exactly
    with settings(free_unused_tiles=False):
        res = run(_small_tiles_kernel(0), target="trn2")
    assert res.peak_sbuf_bytes == usable


def test_one_element_more_is_still_an_overflow_with_the_numbers():
    with pytest.raises(MemoryPlanError) as e, settings(free_unused_tiles=False):
        run(_small_tiles_kernel(1), target="trn2")
    msg = str(e.value)
    assert e.value.rule == "SBUF_OVERFLOW"
    assert "placed at 4-byte alignment" in msg and "of 212984 usable B per partition" in msg


def test_kernels_that_fit_at_64_bytes_keep_their_64_byte_placement():
    def kernel():
        live = [nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf) for _ in range(3)]
        assert len(live) == 3

    with settings(free_unused_tiles=False):
        res = run(kernel, target="trn2")
    assert res.peak_sbuf_bytes == 3 * SBUF_ALIGN
