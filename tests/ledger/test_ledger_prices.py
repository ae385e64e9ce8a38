"""Prices: the data file's status, --price overrides, clean errors, payback arithmetic."""

from __future__ import annotations

import json

import pytest

from nki_kernels.ledger.models import from_hf_config, get_model
from nki_kernels.ledger.prices import (
    INSTANCES_FILE,
    load_instances,
    parse_price,
    payback,
    price_text,
    usd_per_million,
    with_overrides,
)


def test_every_instance_states_where_its_price_stands():
    instances, raw = load_instances()
    assert raw["read"] and raw["method"]
    for name, d in raw["instances"].items():
        assert d["hardware_source"], name
        for r in d["recorded"]:  # every price found: its kind, source, publisher and date
            assert r["usd_per_hour"] > 0 and r["kind"] in raw["kinds"], (name, r)
            assert r["source"].startswith("http") and r["publisher"] and r["read"], (name, r)
        if d["default_price"] is None:
            # none read on AWS's own page: the status says so and names the --price to pass
            assert f"--price {name}=" in d["price_status"], name
            assert instances[name].usd_per_hour is None
    assert {"trn2.48xlarge", "trn2.3xlarge", "p5en.48xlarge", "p5.48xlarge"} <= set(instances)


def test_recorded_price_is_used_only_when_asked_and_says_its_kind():
    base = load_instances()[0]
    assert base["p5.48xlarge"].usd_per_hour is None  # recorded, but not from an AWS page
    inst = with_overrides(base, ["p5.48xlarge=recorded"])["p5.48xlarge"]
    first = base["p5.48xlarge"].recorded[0]
    assert inst.usd_per_hour == first["usd_per_hour"]
    assert inst.price_kind == f"{first['kind']}, not from an AWS page"
    assert first["source"] in price_text(inst) and first["kind"] in price_text(inst)
    with pytest.raises(ValueError, match=r"trn2\.48xlarge has no recorded price"):
        with_overrides(base, ["trn2.48xlarge=recorded"])


def test_price_kind_is_carried():
    inst = with_overrides(load_instances()[0], ["trn2.48xlarge=30:capacity-block"])
    assert inst["trn2.48xlarge"].price_kind == "Capacity Block"
    assert "Capacity Block" in price_text(inst["trn2.48xlarge"])
    with pytest.raises(ValueError, match="--price: expected KIND"):
        parse_price("trn2.48xlarge=30:reserved-ish")


def test_logical_cores_follow_lnc():
    inst, _ = load_instances()
    assert inst["trn2.48xlarge"].logical_cores(2) == 64  # 16 chips x 8 cores / 2
    assert inst["trn2.48xlarge"].logical_cores(1) == 128
    assert inst["p5en.48xlarge"].logical_cores(2) == 8  # GPUs, whatever the LNC


def test_price_override_is_used_and_named():
    inst = with_overrides(load_instances()[0], ["trn2.48xlarge=36", "p5en.48xlarge=72.5"])
    assert inst["trn2.48xlarge"].usd_per_hour == 36.0
    assert inst["trn2.48xlarge"].price_source == "given with --price"
    assert inst["trn2.48xlarge"].price_kind == "kind not stated"
    # 36 $/h at 1000 tokens/s: 36 / 3600 s per ... = 0.01 $/s -> 1e6 tokens take 1000 s
    assert usd_per_million(1000.0, inst["trn2.48xlarge"]) == pytest.approx(10.0)
    assert usd_per_million(1000.0, load_instances()[0]["trn2.48xlarge"]) is None


@pytest.mark.parametrize(
    "text", ["trn2.48xlarge", "trn2.48xlarge=", "=3", "x=-1", "x=abc", "x=inf"]
)
def test_bad_price_names_the_option(text):
    with pytest.raises(ValueError, match="--price"):
        parse_price(text)


def test_unknown_instance_is_an_error():
    with pytest.raises(ValueError, match=r"--price: unknown instance 'p9\.huge'"):
        with_overrides(load_instances()[0], ["p9.huge=1"])


def test_payback_months():
    # 8 weeks x $5,000 = $40,000; $100,000 / month at 0.75x the cost saves $25,000 / month
    p = payback(8, 5000, 100_000, 0.75)
    assert p.port_cost_usd == 40_000 and p.monthly_saving_usd == pytest.approx(25_000)
    assert p.months == pytest.approx(1.6)
    never = payback(8, 5000, 100_000, 1.2)
    assert never.months is None and "never" in never.text()
    with pytest.raises(ValueError, match="--port-weeks"):
        payback(-1, 5000, 100_000, 0.5)


def test_instances_file_is_valid_json():
    json.loads(INSTANCES_FILE.read_text())


def test_transformers_config(tmp_path):
    cfg = {
        "model_type": "qwen3_moe",
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": 1000,
        "intermediate_size": 512,
        "num_experts": 16,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 64,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = from_hf_config(tmp_path)
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim) == (4, 256, 8, 2, 32)
    assert (m.experts, m.top_k, m.moe_intermediate, m.moe_layers) == (16, 4, 64, 4)
    (tmp_path / "bad.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ValueError, match="lacks num_hidden_layers"):
        from_hf_config(tmp_path / "bad.json")


def test_unknown_model_names_the_option():
    with pytest.raises(ValueError, match="--model: expected one of llama3-8b"):
        get_model("gpt-17")
