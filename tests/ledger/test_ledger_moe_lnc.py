"""How the ledger prices our MoE layer at LNC 2 (the module doc of `ledger.trainium`):
the forward of a committed case is its kernel[2] row; any other forward, and every
backward, is two cores each routing half of the tokens through the LNC 1 kernels."""

from __future__ import annotations

from typing import Any

import pytest

from nki_kernels.ledger import trainium
from nki_kernels.ledger.models import MIXTRAL_8X7B
from nki_kernels.ledger.store import RowStore
from nki_kernels.moe import pricing

TARGET, LNC = "trn2", 2


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # never the user's cache
    # reprice: the cached ledger rows are not read, so the figure is priced here
    return RowStore(cache=tmp_path / "ledger_rows.jsonl", reprice=True)


@pytest.fixture
def layer_calls(monkeypatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    def layer_row(shape: Any, tokens: int, kind: str, target: Any, **kw: Any) -> dict[str, Any]:
        calls.append({"tokens": tokens, "lnc": kw.get("lnc", 1), "backward": kw["backward"]})
        return {"latency_ms": 2.0, "bwd_ms": 3.0}

    monkeypatch.setattr(pricing, "layer_row", layer_row)
    return calls


@pytest.mark.parametrize(("t", "kind"), [(4096, "bwd"), (1000, "fwd"), (1000, "bwd")])
def test_lnc2_moe_is_two_lnc1_cores_on_half_the_tokens(store, layer_calls, t, kind) -> None:
    f = trainium.moe(store, "ours", MIXTRAL_8X7B, t, kind, TARGET, LNC)
    assert f is not None and "committed row" not in f.source
    assert layer_calls, "not priced through moe.pricing.layer_row"
    assert {(c["tokens"], c["lnc"], c["backward"]) for c in layer_calls} == {
        (t // 2, 1, kind == "bwd")
    }
    assert f.us == pytest.approx(3000.0 if kind == "bwd" else 2000.0)


def test_lnc2_moe_forward_of_a_committed_case_is_its_kernel2_row(store, layer_calls) -> None:
    r = store.op_row("moe", "moe_mlp fwd uniform", "mixtral-8x7b T=4096 H=4096 I=14336 E=8 "
                     "top-2 bf16", TARGET, LNC, "nki")  # fmt: skip
    assert r is not None and r.lnc == LNC
    f = trainium.moe(store, "ours", MIXTRAL_8X7B, 4096, "fwd", TARGET, LNC)
    assert f is not None and "committed row" in f.source
    assert f.us == pytest.approx(r.latency_us, rel=1e-12)
    assert not layer_calls
