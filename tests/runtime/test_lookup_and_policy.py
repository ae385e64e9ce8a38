"""Issue 16 findings 1, 2 and 5 at the runtime layer: honest lookup, bucket policies the
ops follow, explain(), and config files validated on load."""

from __future__ import annotations

import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import nki_kernels
from nki_kernels.moe.config import MoEProblem
from nki_kernels.norm.config import NormProblem
from nki_kernels.norm.rmsnorm import rms_norm_fwd
from nki_kernels.runtime import KERNEL_CACHE, buckets
from nki_kernels.runtime import config_store as cs
from nki_kernels.runtime.buckets import (
    DEFAULT_POLICY,
    ExplicitBuckets,
    GeometricThenLinear,
    parse_policy,
    policy_for,
)
from nki_kernels.runtime.config_store import (
    DEFAULT,
    NEAREST,
    TUNED,
    ConfigStore,
    InvalidEntryWarning,
    Provenance,
)
from nki_kernels.runtime.kernel_cache import kernel_source_hash


@pytest.fixture(autouse=True)
def _clean_policies() -> Any:
    buckets.reset_bucket_policies()
    yield
    buckets.reset_bucket_policies()


def shipped() -> ConfigStore:
    return ConfigStore([cs.SHIPPED_DIR], None)


# -- finding 1: nearest only across the bucketed dimension ---------------------------------
def test_other_hidden_size_gets_the_default_not_the_hidden_4096_entry() -> None:
    p = NormProblem(rows=2048, hidden=5120, dtype="bfloat16", affine="w")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = shipped().decide("rms_norm", "trn2", p)
    assert d.source == DEFAULT and d.entry_key is None
    assert d.config == type(d.config).heuristic(p, nki_kernels.targets.get_target("trn2"))


def test_other_expert_count_and_top_k_get_the_default() -> None:
    p = MoEProblem(tokens=4096, hidden=2048, intermediate=1408, experts=16, top_k=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = shipped().decide("moe_mlp", "trn2", p)
    assert d.source == DEFAULT


def test_nearest_is_taken_along_the_bucketed_dimension_only() -> None:
    p = NormProblem(rows=4096, hidden=4096, dtype="bfloat16", affine="w")
    d = shipped().decide("rms_norm", "trn2", p)
    assert d.source == NEAREST
    assert d.entry_key is not None and "hidden=4096" in d.entry_key
    exact = NormProblem(rows=8192, hidden=4096, dtype="bfloat16", affine="w")
    assert shipped().decide("rms_norm", "trn2", exact).source == TUNED


def test_explain_names_config_source_and_provenance(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(cs, "_default", None)
    store = cs.set_config_dir(tmp_path)
    stored = NormProblem(rows=512, hidden=64, dtype="float32", affine="w")
    prov = Provenance(kernel_source_hash(rms_norm_fwd), "modeled (test)", 1.0, 2.0, 3, "d")
    cfg_cls = type(store.decide("rms_norm", "trn2", stored).config)
    store.put("rms_norm", "trn2", stored, cfg_cls(**GOOD), prov)
    x, w = torch.randn(200, 64), torch.ones(64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        e = nki_kernels.explain("rms_norm", x, w, 1e-6)
    (d,) = e.decisions
    assert d.problem == "affine=w,dtype=float32,hidden=64,rows=256"
    assert d.source == NEAREST and d.entry_key == cs.problem_key(stored), d.skipped
    assert d.provenance == prov and d.config == cfg_cls(**GOOD)
    text = str(e)
    assert "nearest bucket" in text and prov.kernel_hash in text and "modeled (test)" in text
    with pytest.raises(ValueError, match="op: expected one of"):
        nki_kernels.explain("no_such_op", x)


def test_log_switch_logs_each_decision_once_per_shape(caplog: Any) -> None:
    s = ConfigStore([cs.SHIPPED_DIR], None, log_decisions=True)
    p = NormProblem(rows=8192, hidden=4096, dtype="bfloat16", affine="w")
    with caplog.at_level(logging.INFO, logger="nki_kernels.configs"):
        for _ in range(3):
            s.decide("rms_norm", "trn2", p)
    assert len([r for r in caplog.records if "config decision" in r.message]) == 1


# -- finding 2: the ops follow a bucket policy ----------------------------------------------
def test_parse_policy_round_trips_names() -> None:
    policies = (DEFAULT_POLICY, GeometricThenLinear(128, 2048, 512, 8192), ExplicitBuckets((384,)))
    for p in policies:
        assert parse_policy(p.name()) == p
    assert parse_policy("384, 1408") == ExplicitBuckets((384, 1408))
    with pytest.raises(ValueError, match="bucket_policy: expected"):
        parse_policy("pow3")


def _cached_rows() -> set[int]:
    return {k.args[0][0][0] for k in KERNEL_CACHE._entries if k.kernel.endswith("rms_norm_fwd")}


@pytest.mark.parametrize("how", ["call", "op", "global", "env"])
def test_ops_pad_to_the_policy_boundary(how: str, tmp_path: Path, monkeypatch: Any) -> None:
    x = torch.randn(300, 64)
    w = torch.ones(64)
    kw: dict[str, Any] = {}
    if how == "call":
        kw["bucket_policy"] = "explicit[320,640]"
    elif how == "op":
        nki_kernels.set_bucket_policy(ExplicitBuckets((320, 640)), op="rms_norm")
    elif how == "global":
        nki_kernels.set_bucket_policy("320,640")
    else:
        f = tmp_path / "policy.json"
        buckets.write_policy_file(f, ExplicitBuckets((320, 640)), op="rms_norm")
        monkeypatch.setenv(buckets.POLICY_ENV_VAR, str(f))
        buckets.reset_bucket_policies()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        e = nki_kernels.explain("rms_norm", x, w, 1e-6, **kw)
        y = torch.ops.nki.rms_norm(x, w, 1e-6, **kw)
    assert e.decisions[0].problem.endswith("rows=320")
    assert 320 in _cached_rows()
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)


def test_backward_runs_under_the_forward_policy() -> None:
    x = torch.randn(300, 64, requires_grad=True)
    w = torch.ones(64, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with cs.recording_decisions() as seen:
            torch.ops.nki.rms_norm(x, w, 1e-6, bucket_policy="320,640").sum().backward()
    bwd = [d for d in seen if d.op == "rms_norm_bwd"]
    assert bwd and all(d.problem.endswith("rows=320") for d in bwd)


def test_policy_lookup_order_and_backward_names() -> None:
    nki_kernels.set_bucket_policy("512,1024")
    nki_kernels.set_bucket_policy("320", op="moe_mlp")
    assert policy_for("rms_norm") == ExplicitBuckets((512, 1024))
    assert policy_for("moe_mlp_backward") == ExplicitBuckets((320,))
    assert policy_for("moe_mlp", "640") == ExplicitBuckets((640,))


def test_a_bad_policy_argument_names_it() -> None:
    with pytest.raises(ValueError, match="bucket_policy"):
        torch.ops.nki.rms_norm(torch.randn(4, 8), None, 1e-6, bucket_policy="nope")


# -- finding 5: config files validated on load ----------------------------------------------
def _user_file(tmp_path: Path, config: dict[str, Any], key: str | None = None) -> ConfigStore:
    p = NormProblem(rows=512, hidden=64, dtype="float32", affine="w")
    prov = Provenance(kernel_source_hash(rms_norm_fwd), "modeled (test)", 1.0, 2.0, 3, "d")
    entry = {"config": config, "provenance": prov.to_dict()}
    d = tmp_path / "trn2"
    d.mkdir(parents=True, exist_ok=True)
    body = {"format": 1, "op": "rms_norm", "target": "trn2",
            "entries": {key or cs.problem_key(p): entry}}  # fmt: skip
    (d / "rms_norm.json").write_text(json.dumps(body))
    return ConfigStore([tmp_path], tmp_path)


GOOD = {"bufs": 3, "chunk": 64, "gpsimd_eighths": 0, "resident": True,
        "rows_per_partition": 1, "scale_mode": "vector"}  # fmt: skip


@pytest.mark.parametrize(
    ("field", "value"),
    [("chunk", "5120"), ("resident", "no"), ("bufs", None), ("rows_per_partition", 1.5)],
)
def test_a_mistyped_field_is_skipped_with_one_warning(
    tmp_path: Path, field: str, value: Any
) -> None:
    s = _user_file(tmp_path, dict(GOOD, **{field: value}))
    p = NormProblem(rows=512, hidden=64, dtype="float32", affine="w")
    with pytest.warns(InvalidEntryWarning) as rec:
        for _ in range(3):
            d = s.decide("rms_norm", "trn2", p, kernel_hash=kernel_source_hash(rms_norm_fwd))
    msgs = [str(r.message) for r in rec if r.category is InvalidEntryWarning]
    assert len(msgs) == 1
    assert "rms_norm.json" in msgs[0] and "rows=512" in msgs[0] and f"config.{field}" in msgs[0]
    assert d.source == DEFAULT


def test_a_config_that_does_not_fit_is_skipped_with_a_warning(tmp_path: Path) -> None:
    s = _user_file(tmp_path, dict(GOOD, chunk=8192, resident=True, rows_per_partition=8))
    p = NormProblem(rows=512, hidden=64, dtype="float32", affine="w")
    with pytest.warns(InvalidEntryWarning, match="does not fit"):
        d = s.decide("rms_norm", "trn2", p)
    assert d.source == DEFAULT and d.skipped


@pytest.mark.parametrize("body", ['{"format": 1, "entries": []}', '{"format": 1, "entr', "null"])
def test_a_broken_file_is_skipped_with_a_warning(tmp_path: Path, body: str) -> None:
    (tmp_path / "trn2").mkdir()
    (tmp_path / "trn2" / "rms_norm.json").write_text(body)
    s = ConfigStore([tmp_path], tmp_path)
    p = NormProblem(rows=512, hidden=64, dtype="float32", affine="w")
    with pytest.warns(InvalidEntryWarning, match="rms_norm.json"):
        assert s.decide("rms_norm", "trn2", p).source == DEFAULT


def test_written_files_are_group_readable_and_leave_no_debris(tmp_path: Path) -> None:
    s = ConfigStore([tmp_path], tmp_path)
    p = NormProblem(rows=512, hidden=64, dtype="float32", affine="w")
    (tmp_path / "trn2").mkdir()
    (tmp_path / "trn2" / ".rms_norm.killed.json.tmp").write_text("{")  # a killed writer's
    (tmp_path / "trn2" / "rms_norm.json.lock").write_text("")  # an older version's lock
    cfg = type(s.decide("rms_norm", "trn2", p).config)(**GOOD)
    old = os.umask(0o077)
    try:
        path = s.put("rms_norm", "trn2", p, cfg, Provenance("h", "m", 1.0, 2.0, 1, "d"))
    finally:
        os.umask(old)
    assert sorted(x.name for x in path.parent.iterdir()) == ["rms_norm.json"]
    assert path.stat().st_mode & 0o777 == 0o644


def test_attention_follows_a_per_call_policy() -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 200, 64, generator=g) for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with cs.recording_decisions() as seen:
            out = nki_kernels.flash_attention(q, k, v, causal=True, bucket_policy="384")
    assert seen and all("seq_k=384" in d.problem and "seq_q=384" in d.problem for d in seen)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)
