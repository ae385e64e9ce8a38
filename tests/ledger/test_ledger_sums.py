"""The ledger's per-layer sums are built from the committed op-level benchmark rows: where
a ledger op is exactly a committed case, its figure is that row (times the sequences of
the step), and a layer's total is the sum of those rows with the band summed per
parameter set and widened by the cost model's structural error, as the rows' own bands are."""

from __future__ import annotations

import pytest

from nki_kernels.bench.rows import BenchRow
from nki_kernels.ledger.figure import Figure, total
from nki_kernels.ledger.layers import Step, layer_ops
from nki_kernels.ledger.ledger import Ledger, OpFigures
from nki_kernels.ledger.models import LLAMA3_8B, MIXTRAL_8X7B
from nki_kernels.ledger.store import RowStore, current_version, version_of
from nki_kernels.ledger.trainium import price_op
from nki_kernels.perfmodel.band import structural_pct, widen

TARGET, LNC = "trn2", 2


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # never the user's cache
    return RowStore(cache=tmp_path / "ledger_rows.jsonl")


def _row(store: RowStore, family: str, op: str, case: str, impl: str) -> BenchRow:
    r = store.op_row(family, op, case, TARGET, LNC, impl)
    assert r is not None, f"no committed row {impl} {op} {case}"
    if version_of(r.provenance) != current_version():
        pytest.skip(
            f"the committed row {impl} {op} {case} is {r.provenance}, not cost model "
            f"{current_version()}: re-price it (`nki-kernels bench --reprice --full`)"
        )
    return r


def _priced(store: RowStore, model, step: Step, groups: tuple[str, ...], moe: bool) -> Ledger:
    ops = [o for o in layer_ops(model, step, moe) if o.group in groups]
    figs = [
        OpFigures(
            "layer", o, {i: price_op(store, o, i, model, TARGET, LNC) for i in ("ours", "native")}
        )
        for o in ops
    ]
    return Ledger(model, step, TARGET, LNC, figs, [("layer", 1, moe)])


def test_attention_and_norm_sums_are_the_committed_rows(store):
    # Llama-3 8B training, 2 sequences of 8192 tokens per logical core: the norms run on
    # [16384, 4096] (a committed case) and attention on 2 x the B=1, S=8192 case
    step = Step("train", 2, seq=8192)
    led = _priced(store, LLAMA3_8B, step, ("attention", "norms"), moe=False)
    case = "B=1 H=32/8 S=8192 D=128 bf16"
    for impl, row_impl in (("ours", "nki"), ("native", "aws")):
        fwd = _row(store, "attention", "flash_attention fwd causal", case, row_impl)
        bwd = _row(store, "attention", "flash_attention bwd causal", case, row_impl)
        norm_f = _row(
            store,
            "norm",
            "add_rms_norm fwd",
            "[16384, 4096] bf16",
            "nki" if impl == "ours" else "native",
        )
        norm_b = _row(
            store,
            "norm",
            "rms_norm bwd",
            "[16384, 4096] bf16",
            "nki" if impl == "ours" else "native",
        )
        # attention: 2 sequences x (fwd + bwd); norms: 2 launches each (count 2)
        want_attn = 2 * fwd.latency_us + 2 * bwd.latency_us
        want_norm = 2 * norm_f.latency_us + 2 * norm_b.latency_us
        attn = led.layer_total("layer", impl, "attention")
        norms = led.layer_total("layer", impl, "norms")
        assert attn is not None and norms is not None
        assert attn.us == pytest.approx(want_attn, rel=1e-12)
        assert norms.us == pytest.approx(want_norm, rel=1e-12)
        # the band of the sum: per parameter set, the same arithmetic on the rows' samples
        sets = [
            2 * a + 2 * b
            for a, b in zip(fwd.extra["samples_us"], bwd.extra["samples_us"], strict=True)
        ]
        assert attn.band == pytest.approx((min(sets), max(sets)), rel=1e-12)
        # printed with the structural term, exactly as a single committed row's band is
        assert attn.full_band == pytest.approx(widen(min(sets), max(sets), TARGET), rel=1e-12)
        one = price_op(store, led.ops[0].op, impl, LLAMA3_8B, TARGET, LNC)
        assert one is not None and one.structural_pct == structural_pct(TARGET) > 0
        assert all(
            "committed row" in o.figs[impl].source for o in led.ops if o.op.group == "attention"
        )


def test_moe_forward_is_the_committed_row(store):
    # Mixtral prefill at 4096 tokens per logical core: the MoE forward is the committed
    # T=4096 uniform case, ours and the dropless native baseline
    step = Step("prefill", 1, seq=4096)
    led = _priced(store, MIXTRAL_8X7B, step, ("moe",), moe=True)
    case = "mixtral-8x7b T=4096 H=4096 I=14336 E=8 top-2 bf16"
    for impl, row_impl in (("ours", "nki"), ("native", "native")):
        r = _row(store, "moe", "moe_mlp fwd uniform", case, row_impl)
        got = led.layer_total("layer", impl, "moe")
        assert got is not None
        assert got.us == pytest.approx(r.latency_us, rel=1e-12)
        if r.band_us is not None:
            assert got.band == pytest.approx(tuple(r.band_us), rel=1e-12)
        else:  # priced without its parameter sets: the structural term alone, said so
            assert got.band == pytest.approx((r.latency_us, r.latency_us), rel=1e-12)
            assert got.full_band == pytest.approx(widen(r.latency_us, r.latency_us, TARGET))
            assert got.full_band[0] < got.us < got.full_band[1]


def test_total_sums_bands_per_parameter_set():
    a = Figure(10.0, "modeled (cost model v9, trn2)", band=(9.0, 12.0), samples=(10.0, 9.0, 12.0))
    b = Figure(5.0, "modeled (cost model v9, trn2)", band=(4.0, 6.0), samples=(5.0, 6.0, 4.0))
    t = total([a, b])
    # per set: 10 + 5, 9 + 6, 12 + 4 -> 15, 15, 16 (narrower than 13..18 from the ends)
    assert t.us == 15.0 and t.band == (15.0, 16.0) and t.samples == (15.0, 15.0, 16.0)
    assert t.label == "modeled (cost model v9, trn2)"


def test_a_committed_rows_figure_prints_the_rows_own_band(store):
    # op-level rows of the current model store their band widened by the structural
    # term; the ledger's figure of that row prints the same band
    case = "B=1 H=32/8 S=8192 D=128 bf16"
    r = _row(store, "attention", "flash_attention fwd causal", case, "nki")
    led = _priced(store, LLAMA3_8B, Step("prefill", 1, seq=8192), ("attention",), moe=False)
    f = led.layer_total("layer", "ours", "attention")
    assert f is not None and f.us == pytest.approx(r.latency_us, rel=1e-12)
    assert f.full_band == pytest.approx(tuple(r.band_us), rel=1e-12)


def test_total_carries_the_structural_error_through_the_sum():
    lab = "modeled (cost model v9, trn2)"
    a = Figure(10.0, lab, band=(9.0, 12.0), samples=(10.0, 9.0, 12.0), structural_pct=15.0)
    b = Figure(5.0, lab, band=(4.0, 6.0), samples=(5.0, 6.0, 4.0), structural_pct=15.0)
    t = total([a.scaled(2), b])
    assert t.band == (24.0, 28.0) and t.structural_pct == 15.0 and not t.notes
    assert t.full_band == pytest.approx((24.0 / 1.15, 28.0 * 1.15))
    older = Figure(5.0, "modeled (cost model v8, trn2)", band=(4.0, 6.0), samples=(5.0, 6.0, 4.0))
    mixed = total([a, older])
    assert mixed.structural_pct == 15.0 and any("15 %" in n for n in mixed.notes)


def test_total_without_samples_adds_ends_and_says_so():
    a = Figure(10.0, "modeled (cost model v9, trn2)", band=(9.0, 12.0))
    b = Figure(5.0, "measured (GPU X, torch 1)")
    t = total([a, b])
    assert t.band == (14.0, 17.0)  # 9 + 5, 12 + 5
    assert t.label.startswith("mixed: ") and "measured (GPU X" in t.label
    assert any("lows and highs" in n for n in t.notes)


def test_total_of_nothing_is_an_error():
    with pytest.raises(ValueError, match="no figures"):
        total([])


def test_decode_attention_is_the_committed_stream_row(store):
    # Llama-3 8B serving, 64 sequences over 32K caches: our decode kernel's figure is the
    # decode benchmark's streamed row (32 / 8 heads, LNC 2), band and samples included
    import json

    from nki_kernels.attention.decode_stream import decode_stream_fwd
    from nki_kernels.ledger.store import DATA
    from nki_kernels.runtime.kernel_cache import kernel_source_hash

    rows = json.loads((DATA / "decode_stream_rows.json").read_text())["rows"]
    want = ("ours (streamed)", TARGET, 4, LNC, 64, 32768, False)
    (r,) = [
        r
        for r in rows
        if (r["method"], r["target"], r["group"], r["lnc"], r["batch"], r["cache"], r["paged"])
        == want
    ]
    if r.get("kernel_hash") != kernel_source_hash(decode_stream_fwd):
        pytest.skip("the committed streamed decode row is of other kernel source")
    led = _priced(store, LLAMA3_8B, Step("decode", 64, context=32768), ("attention",), False)
    (o,) = [o for o in led.ops if o.op.kind == "decode_attention"]
    f = o.figs["ours"]
    assert f.us == r["latency_us"] and f.samples == tuple(r["samples_us"])
    assert "decode_stream_rows.json" in f.source
