"""The simulated serving loop (CI size): tiny Llama-style and GPT-OSS-style decoders,
a scheduler mixing prefill chunks, prefix hits, decode rows and speculative drafts over
a paged cache with frozen shapes, compiled with torch.compile(fullgraph=True) and then
`fail_on_recompile`; every step's logits against the float64 model without a cache.
The 200-step run: `benchmarks/serving_loop.py --steps 200`."""

from __future__ import annotations

import pytest

from nki_kernels.serving.simloop import TinyConfig, run

STEPS = 24
TOLERANCE = 1e-4  # fp32 logits vs float64, relative to max |logit|


@pytest.mark.parametrize("gpt_oss", [False, True], ids=["llama", "gpt-oss"])
def test_serving_loop_compiled(gpt_oss: bool) -> None:
    res = run(TinyConfig(gpt_oss=gpt_oss), STEPS, seed=1)
    assert res["worst_rel_err"] <= TOLERANCE
    # the mix the loop exists for happened
    for kind in ("prefill_chunks", "prefix_hits", "decode_rows", "drafts"):
        assert res[kind] >= 1, kind
