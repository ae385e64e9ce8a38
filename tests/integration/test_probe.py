"""`nki-kernels probe`: what the library takes over in a model, and why not the rest."""

from __future__ import annotations

import pytest
import torch

from nki_kernels.cli import main
from nki_kernels.integrations.probe import probe

pytest.importorskip("transformers")
from nki_kernels.parity.models import tiny_model


def _by_op(findings):
    return {f.op: f for f in findings}


def test_probe_mixtral_lists_norms_attention_and_moe_taken_and_linears_not() -> None:
    found = _by_op(probe(tiny_model("mixtral")))
    assert found["MixtralRMSNorm -> nki rms_norm"].count == 5
    assert found["MixtralSparseMoeBlock -> nki moe_mlp (router logits kept)"].taken
    assert found["attention"].taken and "GQA 4/2" in found["attention"].why
    assert not found["nn.Linear"].taken


def test_probe_says_why_not() -> None:
    wide = probe(tiny_model("llama", head_dim=320))
    assert not _by_op(wide)["attention"].taken and "head_dim 320" in _by_op(wide)["attention"].why
    dropout = _by_op(probe(tiny_model("llama", attention_dropout=0.1)))
    assert not dropout["attention (training)"].taken
    gelu = _by_op(probe(tiny_model("mixtral", hidden_act="gelu")))
    assert any("activation 'gelu'" in op for op in gelu)


def test_probe_takes_softcapped_attention() -> None:
    capped = _by_op(probe(tiny_model("llama", attn_logit_softcapping=50.0)))
    assert capped["attention"].taken and "logit softcap 50.0" in capped["attention"].why


def test_probe_plain_model_and_cli(capsys) -> None:
    plain = _by_op(probe(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))))
    assert plain["LayerNorm -> nki LayerNorm"].taken
    assert not plain["scaled_dot_product_attention calls"].taken
    assert main(["probe", "tiny-llama"]) == 0
    assert "| LlamaRMSNorm -> nki rms_norm | 5 | yes |" in capsys.readouterr().out


def test_probe_names_the_dtype_it_does_not_take() -> None:
    half = [f for f in probe(tiny_model("mixtral").half()) if "MoeBlock" in f.op]
    assert len(half) == 1 and not half[0].taken
    assert "dtype torch.float16 (supported: float32, bfloat16)" in half[0].op
    bf16 = [f for f in probe(tiny_model("mixtral").bfloat16()) if "MoeBlock" in f.op]
    assert len(bf16) == 1 and bf16[0].taken
