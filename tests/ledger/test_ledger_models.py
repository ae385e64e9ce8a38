"""DeepSeek's multi-head latent attention: the ledger's projections are the real low-rank
shapes (from transformers' DeepseekV3 config and from the built-in entry alike), and what
it still approximates is named (`test_ledger_mla.py` checks the attention itself)."""

from __future__ import annotations

import json

import pytest

from nki_kernels.ledger.models import MODELS, from_hf_config


def _mla_shapes(c: dict) -> list[tuple[str, int, int]]:
    qk = c["num_attention_heads"] * (c["qk_nope_head_dim"] + c["qk_rope_head_dim"])
    kv = c["num_attention_heads"] * (c["qk_nope_head_dim"] + c["v_head_dim"])
    return [
        ("q_a_proj", c["hidden_size"], c["q_lora_rank"]),
        ("q_b_proj", c["q_lora_rank"], qk),
        ("kv_a_proj", c["hidden_size"], c["kv_lora_rank"] + c["qk_rope_head_dim"]),
        ("kv_b_proj", c["kv_lora_rank"], kv),
        ("o_proj", c["num_attention_heads"] * c["v_head_dim"], c["hidden_size"]),
    ]


def test_deepseek_projections_are_mla_shapes(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.DeepseekV3Config().to_dict()
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    from_config = from_hf_config(tmp_path)
    assert from_config.is_mla and from_config.projections() == _mla_shapes(cfg)
    assert from_config.head_dim == cfg["v_head_dim"]
    assert from_config.nope_dim == cfg["qk_nope_head_dim"]
    assert "as it runs" in from_config.changes and "APPROXIMATED" in from_config.changes
    builtin = MODELS["deepseek-v3-like"]
    assert builtin.projections() == _mla_shapes(cfg)  # the V3 release's numbers


def test_deepseek_note_says_how_mla_runs_and_what_is_approximated():
    note = MODELS["deepseek-v3-like"].changes
    assert "192" in note and "576" in note and "absorbed" in note
    assert "falls back" in note  # ours cannot run D_qk != D_v: the native path, said so
    assert "APPROXIMATED" in note and "routing" in note


def test_plain_attention_projections_are_unchanged():
    m = MODELS["llama3-8b"]
    assert not m.is_mla
    assert m.projections() == [("qkv_proj", 4096, 4096 + 2 * 1024), ("o_proj", 4096, 4096)]
