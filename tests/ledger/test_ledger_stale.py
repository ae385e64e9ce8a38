"""The documented commands print from committed rows, and a ledger row whose code changed
since it was priced is found by its stamp: printed 'stale', or priced again on request."""

from __future__ import annotations

import json
import shutil

import pytest

from nki_kernels.bench.rows import read_rows
from nki_kernels.ledger import docs, stamps
from nki_kernels.ledger.layers import Step
from nki_kernels.ledger.ledger import build
from nki_kernels.ledger.models import get_model
from nki_kernels.ledger.prices import load_instances
from nki_kernels.ledger.report import ledger_text
from nki_kernels.ledger.store import COMMITTED_CACHE, DATA, STALE, RowStore


@pytest.mark.parametrize("argv", docs.REFRESH, ids=lambda a: " ".join(a[1:]))
def test_documented_commands_need_no_pricing(argv):
    # the README's, the manual's, the help's and every model's documented shapes: a dry
    # query (nothing priced) of what the command would price from the committed rows alone
    missing, _ = docs.needs(argv)
    assert missing == []


def test_every_model_and_phase_is_documented():
    cases = {" ".join(a) for a in docs.REFRESH}
    for model in docs.MODEL_NAMES:
        for phase in ("train", "prefill", "decode"):
            assert any(f"--model {model} --phase {phase}" in c for c in cases), (model, phase)


def _price_calls(value: float, calls: list[int]):
    def price(_target):
        calls.append(1)
        return value

    return price


KEY = "matmul [64, 128] x [128, 256] bf16 (per core)"


def test_a_row_with_another_stamp_is_reported_stale_then_repriced(tmp_path):
    cache = tmp_path / "rows.jsonl"
    calls: list[int] = []
    first = RowStore(data=tmp_path, cache=cache)
    f = first.get_or_price(KEY, "trn2", 2, "compiler", _price_calls(5.0, calls), "matmul")
    assert f.us == 5.0 and calls and not first.stale
    (row,) = read_rows(cache)
    assert row.extra["stamp"] == stamps.stamp("matmul", "compiler", "trn2")[0]

    # the row as if priced before a change to the native composition's code
    d = json.loads(cache.read_text())
    part = "nki_kernels.baselines.steps.matmul_step"
    d["extra"]["stamp"] = "0" * 16
    d["extra"]["stamp_parts"][part] = "0" * 16
    cache.write_text(json.dumps(d) + "\n")

    calls.clear()
    seen = RowStore(data=tmp_path, cache=cache)
    f = seen.get_or_price(KEY, "trn2", 2, "compiler", _price_calls(7.0, calls), "matmul")
    assert f.us == 5.0 and not calls  # used as priced, not silently: noted and listed
    assert any(n.startswith(STALE) and "baselines.steps.matmul_step" in n for n in f.notes)
    assert list(seen.stale.values()) == [["baselines.steps.matmul_step"]]

    again = RowStore(data=tmp_path, cache=cache, refresh_stale=True)
    f = again.get_or_price(KEY, "trn2", 2, "compiler", _price_calls(7.0, calls), "matmul")
    assert f.us == 7.0 and calls and not again.stale
    rows = read_rows(cache)  # replaced in place, one row per key
    assert len(rows) == 1 and rows[0].latency_us == 7.0
    assert rows[0].extra["stamp"] == stamps.stamp("matmul", "compiler", "trn2")[0]


def test_an_unstamped_row_is_stale():
    assert stamps.changed(None, {"x": "1"}) == ["unstamped (priced before rows were stamped)"]
    assert stamps.changed({"nki_kernels.a": "1", "b": "2"}, {"nki_kernels.a": "3", "b": "2"}) == [
        "a"
    ]


def test_dry_store_prices_nothing_and_lists_it(tmp_path):
    calls: list[int] = []
    store = RowStore(data=tmp_path, cache=tmp_path / "rows.jsonl", dry=True)
    store.get_or_price(KEY, "trn2", 2, "compiler", _price_calls(5.0, calls), "matmul")
    assert not calls and not store.priced and len(store.missing) == 1
    assert not (tmp_path / "rows.jsonl").exists()


def test_config_stamp_ignores_latencies_not_configs(tmp_path, monkeypatch):
    from nki_kernels.runtime import config_store

    src = config_store.SHIPPED_DIR / "trn2" / "rms_norm.json"
    (tmp_path / "trn2").mkdir()
    dst = tmp_path / "trn2" / "rms_norm.json"
    monkeypatch.setattr(config_store, "SHIPPED_DIR", tmp_path)
    d = json.loads(src.read_text())
    dst.write_text(json.dumps(d))
    base = stamps._config_hash("rms_norm", "trn2")
    entry = next(iter(d["entries"].values()))
    entry["provenance"]["latency_ns"] = 1.0
    dst.write_text(json.dumps(d))
    assert stamps._config_hash("rms_norm", "trn2") == base
    entry["config"]["bufs"] = 99
    dst.write_text(json.dumps(d))
    assert stamps._config_hash("rms_norm", "trn2") != base


def test_the_ledger_prints_stale_figures_as_stale(tmp_path):
    for p in DATA.iterdir():
        if p.is_file() and p.name != COMMITTED_CACHE.name:
            (tmp_path / p.name).symlink_to(p)
    shutil.copy(COMMITTED_CACHE, tmp_path / COMMITTED_CACHE.name)
    model, step = get_model("llama3-8b"), Step("decode", 64, context=32768)
    before = build(model, step, "trn2", 2, RowStore(data=tmp_path, cache=tmp_path / "c", dry=True))

    rows = [json.loads(line) for line in (tmp_path / COMMITTED_CACHE.name).read_text().splitlines()]
    for r in rows:
        if r["op"] == "norm":
            r["extra"]["stamp"] = "0" * 16
    (tmp_path / COMMITTED_CACHE.name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    store = RowStore(data=tmp_path, cache=tmp_path / "c", dry=True)
    led = build(model, step, "trn2", 2, store)
    assert store.stale and not store.missing
    norms = {o.op.name for o in led.ops if o.op.kind == "norm"}
    assert norms and set(led.stale_ops()) == norms | set(before.stale_ops())
    text = ledger_text(led, load_instances()[0]["trn2.48xlarge"], None)
    assert "STALE:" in text and "stale" in text.split("norms (")[1].splitlines()[0]
    if not before.stale_ops():  # the committed rows are current: only the norms are marked
        assert "stale" not in text.split("matmuls left")[1].splitlines()[0]


def test_a_stopped_pricing_resumes_from_its_priced_parameter_sets(tmp_path, monkeypatch):
    from nki_kernels.bench.bands import parameter_sets

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    n = len(parameter_sets("trn2"))
    calls: list[int] = []

    def stops_after_two(_target):
        calls.append(1)
        if len(calls) > 2:
            raise KeyboardInterrupt  # a timeout's kill, in effect
        return float(len(calls))

    store = RowStore(data=tmp_path, cache=tmp_path / "rows.jsonl")
    with pytest.raises(KeyboardInterrupt):
        store.get_or_price(KEY, "trn2", 2, "compiler", stops_after_two, "matmul")
    assert not (tmp_path / "rows.jsonl").exists()

    again: list[int] = []
    store = RowStore(data=tmp_path, cache=tmp_path / "rows.jsonl")
    f = store.get_or_price(KEY, "trn2", 2, "compiler", _price_calls(9.0, again), "matmul")
    assert len(again) == n - 2  # the first two sets were not priced again
    assert f.samples == (1.0, 2.0, *([9.0] * (n - 2)))
    from nki_kernels.ledger.store import partial_path

    assert json.loads(partial_path().read_text()) == {}  # done: nothing left waiting
