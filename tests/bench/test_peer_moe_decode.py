"""AWS moe_tkg as a decode MoE peer (bench/peer_moe_decode.py): the launch it prices, its
token limit, and (with a local nki-library checkout) a priced row and the extrapolation
in T against the exact launch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import nki_kernels.bench.peer_moe_decode as peer
from nki_kernels.model_shapes import MoEShape

NKILIB = Path("/work/ext/aws-neuron+nki-library")
SMALL = MoEShape("small", hidden=512, intermediate=128, num_experts=4, top_k=2)


def test_the_launch_matches_moe_tkg_signature() -> None:
    sel = peer.moe_tkg_call(SMALL, 8, 2, all_expert=False)
    shapes = [a.shape for a in sel.args[:5]]
    assert shapes == [(8, 512), (4, 512, 2, 128), (4, 128, 512), (8, 4), (8, 2)]
    assert sel.args[5] is False and sel.lnc == 2 and sel.module == peer.TKG_MODULE
    full = peer.moe_tkg_call(SMALL, 8, 2, all_expert=True, experts=2)
    assert full.args[1].shape == (2, 512, 2, 128) and full.args[5] is True
    assert full.args[6].shape == (1, 1) and full.kwargs == {"mask_unselected_experts": True}


def test_selective_mode_past_128_tokens_is_refused_with_its_limit() -> None:
    p = peer.price_moe_tkg(Path("/nonexistent"), SMALL, 129)
    assert p.latency_us is None and "T <= 128" in p.error


@pytest.mark.skipif(not NKILIB.is_dir(), reason="needs a local nki-library checkout")
def test_a_small_row_prices_and_the_extrapolation_tracks_the_exact_launch(monkeypatch: Any) -> None:
    exact = peer.price_moe_tkg(NKILIB, SMALL, 32)
    assert exact.error == "" and exact.method == "exact" and exact.latency_us > 0
    monkeypatch.setattr(peer, "EXACT_PAIRS", 0)
    line = peer.price_moe_tkg(NKILIB, SMALL, 32)
    assert line.method == "extrapolated in T from 8, 16"
    assert abs(line.latency_us / exact.latency_us - 1) < 0.02
