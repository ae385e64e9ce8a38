"""Native's MoE at decode under LNC 2 (`ledger.native_moe_decode`): the faster, per
parameter set, of the token split and the weight split; the weight split streams half of
the touched expert weights per core; the committed decode rows are what the code prices."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from nki_kernels.baselines import steps
from nki_kernels.bench.compare import expert_counts
from nki_kernels.ledger import native_moe_decode as nmd
from nki_kernels.ledger import trainium
from nki_kernels.ledger.layers import Step
from nki_kernels.ledger.ledger import build
from nki_kernels.ledger.models import get_model
from nki_kernels.ledger.store import RowStore, current_version
from nki_kernels.perfmodel import estimate

TARGET, LNC, BATCH = "trn2", 2, 64
MOE_MODELS = ("mixtral-8x7b", "deepseek-v3-like", "qwen3-moe-like")


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # never the user's cache
    return RowStore(cache=tmp_path / "ledger_rows.jsonl", reprice=True)


def _lowerings(name: str, t: int = BATCH, lnc: int = LNC):
    s = get_model(name).moe_shape()
    h, i, e, k = s.hidden, s.intermediate, s.num_experts, s.top_k
    counts = expert_counts("uniform", t, e, k)
    part = expert_counts("uniform", -(-t // lnc), e, k)
    return (h, i, e, k, counts, part), nmd.lowerings(t, h, i, e, k, "bfloat16", lnc, counts, part)


@pytest.mark.parametrize("name", MOE_MODELS)
def test_weight_split_streams_half_the_touched_weights_per_core(name):
    (h, i, _, _, counts, part), low = _lowerings(name)
    touched = sum(1 for c in counts if c)
    assert touched == sum(1 for c in part if c)  # uniform routing: the same experts touched
    per_expert = (h * 2 * i + i * h) * 2  # gate / up and down, bf16
    assert nmd.weight_bytes(low["token split, _grouped_mm"]) == touched * per_expert
    assert nmd.weight_bytes(low["weight split, _grouped_mm"]) == touched * per_expert // 2
    # the weight split runs every token on each core and adds the partial outputs:
    # one streaming add over [T, H / 2] per core
    (red,) = [st for st in low["weight split, _grouped_mm"] if "partial" in st.name]
    assert red.args[0].shape == (BATCH, h // 2) and red.repeat == 1


def test_weight_bytes_is_what_the_matmul_step_reads_from_hbm():
    # one expert group at a tiny shape: the traced matmul reads the weight once (one M
    # block of rows) and the activations once, nothing else
    low = nmd.lowerings(8, 256, 384, 4, 2, "bfloat16", 2, [4, 4, 4, 4], [2, 2, 2, 2])
    mm = [st for st in low["weight split, _grouped_mm"] if st.kernel is steps.matmul_step]
    for st in mm:
        a_t, b = st.args[0], st.args[1]
        est = estimate(st.kernel, *st.args, target=TARGET)
        assert est.hbm_read_bytes == (math.prod(a_t.shape) + math.prod(b.shape)) * 2
    assert nmd.weight_bytes(mm) == 4 * (256 * 384 + 192 * 256) * 2  # I / 2 = 192 columns


def test_lnc1_has_no_weight_split():
    _, low = _lowerings("qwen3-moe-like", lnc=1)
    assert set(low) == {"token split, _grouped_mm", "token split, NxD blockwise"}
    assert nmd.partial_sum_reduction(BATCH, 2048, "bfloat16", 1) == []


def test_the_native_decode_figure_is_the_per_set_minimum(store, monkeypatch):
    from nki_kernels.bench.bands import parameter_sets

    n = len(parameter_sets(TARGET))
    token = [100.0 + 10 * j for j in range(n)]  # rises with the set
    weight = [100.0 + 10 * (n - 1 - j) for j in range(n)]  # falls: they cross
    calls: list[int] = []

    def fake(*args, **kw):
        j = len(calls)
        calls.append(j)
        return {"token split, _grouped_mm": token[j], "weight split, _grouped_mm": weight[j]}

    monkeypatch.setattr(nmd, "price_lowerings", fake)
    f = trainium.moe(store, "native", get_model("mixtral-8x7b"), BATCH, "fwd", TARGET, LNC)
    assert f is not None and len(calls) == n
    assert f.samples == tuple(min(a, b) for a, b in zip(token, weight, strict=True))
    assert f.us == min(token[0], weight[0])
    assert "weight split" in f.source and "token split" in f.source


@pytest.mark.parametrize(("t", "kind", "lnc"), [(64, "fwd", 1), (1000, "fwd", 2), (64, "bwd", 2)])
def test_weight_split_only_for_the_decode_forward_under_lnc2(store, monkeypatch, t, kind, lnc):
    def fail(*args, **kw):
        raise AssertionError("the weight split priced outside the decode forward at LNC 2")

    monkeypatch.setattr(nmd, "price_lowerings", fail)
    seen: list[str] = []
    monkeypatch.setattr(
        store, "get_or_price", lambda key, *a, **kw: seen.append(key) or trainium.Figure(1.0, "x")
    )
    trainium.moe(store, "native", get_model("mixtral-8x7b"), t, kind, TARGET, lnc)
    assert seen and all("weight split" not in k for k in seen)


@pytest.mark.parametrize("name", MOE_MODELS)
def test_decode_moe_layer_is_the_committed_row(tmp_path, monkeypatch, name):
    # the documented decode ledger (B = 64 x 32K) prices nothing: its native MoE figure is
    # the committed row, current (not stale), band per parameter set included
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    store = RowStore(cache=tmp_path / "c", dry=True)
    model = get_model(name)
    led = build(model, Step("decode", BATCH, context=32768), TARGET, LNC, store)
    assert not store.missing and not store.stale
    want = f"| {TARGET} LNC {LNC} | native | cost model {current_version()}"
    (key,) = [k for k in store.cached() if k.startswith(f"moe decode {name} T={BATCH} ")
              and k.endswith(want)]  # fmt: skip
    (row,) = store.cached()[key]
    got = led.layer_total("MoE layer", "native", "moe")
    assert got is not None
    assert got.us == row.latency_us and got.samples == tuple(row.extra["samples_us"])


@pytest.mark.parametrize("name", ("deepseek-v3-like", "qwen3-moe-like"))
def test_committed_decode_row_is_what_the_code_prices(store, name):
    # priced again here (a second each): every parameter set's figure equals the
    # committed row's, which is the faster of the lowerings, here the weight split
    model = get_model(name)
    got = trainium.moe(store, "native", model, BATCH, "fwd", TARGET, LNC)
    committed = RowStore(cache=Path("-"), dry=True)  # the committed rows alone
    want = trainium.moe(committed, "native", model, BATCH, "fwd", TARGET, LNC)
    assert got is not None and want is not None and not committed.missing
    assert got.samples == pytest.approx(want.samples, rel=1e-12)
    (h, i, e, k, counts, part), _ = _lowerings(name)
    each = nmd.price_lowerings(BATCH, h, i, e, k, "bfloat16", LNC, counts, part, TARGET)
    assert got.us == pytest.approx(min(each.values()), rel=1e-12)
    assert min(each, key=each.__getitem__) == "weight split, _grouped_mm"


def test_decode_rows_are_stamped_with_the_code_that_prices_them():
    # a change to the lowerings makes the native decode rows stale, and only them
    from nki_kernels.ledger import stamps

    mod = "module nki_kernels.ledger.native_moe_decode"
    assert mod in stamps.stamp_parts("moe decode", "native", TARGET)
    assert mod not in stamps.stamp_parts("moe", "native", TARGET)
    assert "nki_kernels.baselines.moe_native.grouped_mm_fwd" in stamps.stamp_parts(
        "moe decode", "native", TARGET
    )
