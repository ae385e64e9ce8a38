"""Convergence, Liger-style: tiny Llama and Mixtral (random init, transformers) train 20
steps on the NKI ops within the noise floor of the reference (the gap between two
correct torch implementations), with a save / reload / continue check on the way."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
from nki_kernels.parity import run_parity
from nki_kernels.parity.models import tiny_llama, tiny_mixtral

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"),
]


def _batches(seed: int, step: int) -> dict[str, Any]:
    """[2, 12] token batches, the second row left-padded by 3 (smaller than the CLI's),
    cycling through 2 batches so 20 steps visibly learn."""
    g = torch.Generator().manual_seed(seed * 65_537 + step % 2)
    ids = torch.randint(3, 128, (2, 12), generator=g)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :3] = 0
    ids[1, :3] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


@pytest.mark.parametrize("factory", [tiny_llama, tiny_mixtral], ids=["llama", "mixtral"])
def test_twenty_steps_within_the_noise_floor(factory) -> None:
    r = run_parity(factory, _batches, steps=20, lr=3e-3, log=lambda _: None)
    assert r.reference.losses[-1] < r.reference.losses[0]  # it trains
    assert r.first_divergent_step is None, (r.deltas, r.tolerance)
    assert sum(r.candidate.nonfinite) == 0
    assert r.resume_max_delta <= r.tolerance
    assert r.passed
