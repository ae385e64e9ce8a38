"""FP8 caches at head_dim 64 and 256 on the decode body (`attention/decode_stream_fp8.py`:
pieces of 8 keys, 3 slots, `decode_step_host.FP8_STREAM`), through `serving_attention`.

The body's SBUF grows with the packed tile (up to 128 columns of G x queries rows per
(sequence, KV head) pair; C * columns <= 512 keys per slab) and its 2-byte converted K /
V slots: bf16 queries over 16 sequences x 8 KV heads fill the largest tiles, at G 4 and
G 1 (the most pairs per slab). Largest SBUF seen (interpreter peak per partition, trn2,
212,984 bytes usable): 211,520 at D 64 G 4; 163,200 at D 256 G 1. Both head dims take
the decode body (one launch, which the interpreter refuses when its tiles do not fit
SBUF) and match the float64 reference; unused slots hold the format's NaN."""

from __future__ import annotations

import pytest
import torch
from _steps import TOLERANCES, assert_rel_close, make_step, record_launches

from nki_kernels.ops.serving import serving_attention
from nki_kernels.serving.reference import reference_serving_attention


@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("d", [64, 256])
def test_fp8_decode_body_fits_sbuf_at_head_dim(
    d: int, group: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    launched = record_launches(monkeypatch)
    step = make_step([(20, 1)] * 16, hq=8 * group, hkv=8, d=d, dtype=torch.bfloat16,
                     cache_dtype=torch.float8_e4m3fn, layout="hnd", seed=7)  # fmt: skip
    kw = {"k_scale": torch.tensor(0.02), "v_scale": torch.tensor([0.015]), "layout": "hnd"}
    ref, _, _ = reference_serving_attention(*step.args(), **kw)
    kc, vc = step.k_cache.clone(), step.v_cache.clone()
    out = serving_attention(step.q, kc, vc, step.block_table, step.cached_seq_len,
                            step.query_start_loc, k=step.k, v=step.v,
                            slot_mapping=step.slot_mapping, **kw)  # fmt: skip
    assert launched == ["serving_decode_fwd"]
    assert torch.isfinite(out).all()
    assert_rel_close(out, ref, TOLERANCES[torch.bfloat16])
