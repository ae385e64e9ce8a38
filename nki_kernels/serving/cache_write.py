"""The cache write alone as an NKI kernel: the new tokens' K and V scattered into the
(paged or contiguous) cache at their slots, quantized for an fp8 cache.

The same phase opens `segmented.serving_attention_fwd` (write, then attend, in one
launch); this kernel is for callers that write without attending in that launch
(vLLM's `reshape_and_cache` step). Arguments as in `segmented.py`: k_new, v_new
[T, Hkv * D]; write_rows int32 [T, 1] (layout row of each token, negative = skip);
scales fp32 [Hkv, 4]; `layout` "nhd" or "hnd"; `fp8_max` > 0 quantizes (x / scale,
saturated to +-fp8_max).
"""

from __future__ import annotations

from ..nki import nki
from .segmented import _flat_views, _write_new_rows


@nki.jit
def cache_write_fwd(k_new, v_new, k_cache, v_cache, write_rows, scales, layout, fp8_max):
    """Write k_new / v_new into k_cache / v_cache in place (nothing returned)."""
    hkv_d = k_new.shape[1]
    hkv = k_cache.shape[2] if layout == "nhd" else k_cache.shape[1]
    d = hkv_d // hkv
    kf, vf, bs = _flat_views(k_cache, v_cache, layout, hkv, d)
    _write_new_rows(k_new, kf, write_rows, scales, 2, layout, bs, hkv, d, fp8_max)
    _write_new_rows(v_new, vf, write_rows, scales, 3, layout, bs, hkv, d, fp8_max)


__all__ = ["cache_write_fwd"]
