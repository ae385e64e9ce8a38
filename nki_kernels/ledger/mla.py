"""DeepSeek's multi-head latent attention (MLA), priced as it runs.

Training and prefill run MLA in its expanded form: queries through the rank-`q_lora_rank`
bottleneck (`q_a_proj`, its RMSNorm, `q_b_proj`), keys and values from the
`kv_lora_rank`-wide latent plus one shared rotary key (`kv_a_proj`, its RMSNorm,
`kv_b_proj`), then attention over 128 heads whose queries and keys are `nope + rope` wide
(192) and whose values are `v` wide (128). Decode runs the absorbed form DeepSeek's
reference inference uses: `kv_b_proj`'s key half is folded into the query (per head,
[nope] -> [kv_lora]) and its value half into the output ([kv_lora] -> [v]), so attention
reads one `kv_lora + rope` (576) value latent per cached token, shared by every head.

What runs where (the reason ours equals native here):
- our flash-attention op takes one head dim for q, k and v, so a call with D_qk 192 and
  D_v 128 falls back to torch SDPA: on Trainium, TorchNeuron's path; and SDPA's head dim
  192 is over the 128 AWS's flash kernel takes, so that path is the S x S composition;
- our decode kernel takes head dims <= 256 with K and V of one width, so absorbed MLA
  (576 / 512) runs as the model's own torch code: the same composition, one query row
  per head against the shared latent.
Both columns therefore price the composition, each figure saying why. The GPU column has
no measured MLA row (`gpu.py` returns none, and the ledger says its totals leave it out).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from ..baselines import native, steps
from ..interp import TensorSpec
from .figure import Figure
from .layers import Op, Step, matmuls
from .models import ModelSpec

BF16 = "bfloat16"
F32 = "float32"
OURS_FALLBACK = {
    "mla_attention": "ours: our flash op takes one head dim for q, k and v (here 192 / 128), "
    "so it falls back to torch SDPA, TorchNeuron's path",
    "mla_decode": "ours: our decode kernel takes head dims <= 256 with K and V of one width "
    "(absorbed MLA: 576 / 512), so the model's torch code runs, TorchNeuron's path",
}


def _t(*shape: int, dtype: str = BF16) -> TensorSpec:
    return TensorSpec(tuple(shape), dtype)


def layer_ops(model: ModelSpec, step: Step) -> list[Op]:
    """The attention block of one MLA layer: norms, projections and attention."""
    train = step.phase == "train"
    t = step.tokens
    h, heads, nope, rope, v = (
        model.hidden,
        model.heads,
        model.nope_dim,
        model.qk_rope_dim,
        model.head_dim,
    )
    q_in, lat = model.q_lora_rank, model.kv_lora_rank
    ops: list[Op] = []
    norms = ([("q_a_layernorm", q_in)] if q_in else []) + [("kv_a_layernorm", lat)]
    for name, width in norms:
        ops.append(Op("norms", f"{name} rms_norm fwd", "norm", ("rms_norm", "fwd", t, width)))
        if train:
            ops.append(Op("norms", f"{name} rms_norm bwd", "norm", ("rms_norm", "bwd", t, width)))
    qk = heads * (nope + rope)
    if q_in:
        ops += matmuls("matmuls", "q_a_proj", t, h, q_in, train)
        ops += matmuls("matmuls", "q_b_proj", t, q_in, qk, train)
    else:
        ops += matmuls("matmuls", "q_proj", t, h, qk, train)
    ops += matmuls("matmuls", "kv_a_proj", t, h, lat + rope, train)
    if step.phase == "decode":
        # absorbed: per head, q_nope [B, nope] -> latent and the output latent -> [B, v]
        ops += [
            Op("matmuls", "q absorb (kv_b key half) fwd", "matmul", (t, nope, lat), heads),
            Op("matmuls", "out absorb (kv_b value half) fwd", "matmul", (t, lat, v), heads),
        ]
        ops.append(
            Op(
                "attention",
                f"absorbed MLA decode (latent {lat} + rope {rope})",
                "mla_decode",
                (step.batch, step.context, heads, lat, rope),
            )
        )
    else:
        ops += matmuls("matmuls", "kv_b_proj", t, lat, heads * (nope + v), train)
        args = (step.seq, step.batch, heads, nope + rope, v)
        kinds = ("fwd", "bwd") if train else ("fwd",)
        for kind in kinds:
            ops.append(
                Op(
                    "attention",
                    f"MLA attention {kind} (causal, q/k {nope + rope}, v {v})",
                    "mla_attention",
                    (kind, *args),
                )
            )
    ops += matmuls("matmuls", "o_proj", t, heads * v, h, train)
    return ops


def attention_steps(kind: str, heads: int, s: int, d_qk: int, d_v: int) -> list[native.Step]:
    """SDPA's S x S composition for one sequence with q / k of `d_qk` and v of `d_v`."""
    sq = _t(s, s)
    if kind == "fwd":
        return [
            native.Step("S = Q K^T", steps.matmul_step, (_t(d_qk, s), _t(d_qk, s), BF16), heads),
            native.Step(
                "P = softmax(S)", steps.softmax_rows, (sq, 1.0 / math.sqrt(d_qk), BF16), heads
            ),
            native.Step("O = P V", steps.matmul_step, (sq, _t(s, d_v), BF16), heads),
        ]
    return [
        native.Step("dP = dO V^T", steps.matmul_step, (_t(d_v, s), _t(d_v, s), BF16), heads),
        native.Step("D = rowsum(dO * O)", steps.reduce_rows, (_t(s, d_v), False, 1), heads),
        native.Step(
            "dS = P * (dP - D)",
            steps.stream_rows,
            (sq, sq, _t(s, 1, dtype=F32), None, 0, 1, BF16),
            heads,
        ),
        native.Step("dQ = dS K", steps.matmul_step, (sq, _t(s, d_qk), BF16), heads),
        native.Step("dK = dS^T Q", steps.matmul_step, (sq, _t(s, d_qk), BF16), heads),
        native.Step("dV = P^T dO", steps.matmul_step, (sq, _t(s, d_v), BF16), heads),
    ]


def decode_steps(heads: int, ctx: int, lat: int, rope: int) -> list[native.Step]:
    """Absorbed MLA for one sequence: every head's latent query against the shared cache."""
    d = lat + rope
    return [
        native.Step("S = Q_lat C^T", steps.matmul_step, (_t(d, heads), _t(d, ctx), BF16)),
        native.Step(
            "P = softmax(S)", steps.softmax_rows, (_t(heads, ctx), 1.0 / math.sqrt(d), BF16)
        ),
        native.Step("O = P C_kv", steps.matmul_step, (_t(ctx, heads), _t(ctx, lat), BF16)),
    ]


def price(store: Any, op: Op, impl: str, target: str, lnc: int) -> Figure | None:
    """Ours and native: the composition (ours falls back to it, said in its source); AWS's
    kernels take neither shape (n/a)."""
    if impl == "aws":
        return None

    def us(build: Any) -> Any:
        return lambda tgt: native.price(build(), tgt).latency_ns / 1e3

    a: Any = op.args
    if op.kind == "mla_attention":
        kind, seq, batch, heads, d_qk, d_v = a
        h = -(-heads // lnc)  # two cores, half the heads each
        key = f"sdpa decomposition {kind} B=1 H={h} S={seq} D_qk={d_qk} D_v={d_v} (per core)"
        build = lambda: attention_steps(kind, h, seq, d_qk, d_v)  # noqa: E731
        f = store.get_or_price(key, target, lnc, "native", us(build), "attention")
        f = f.scaled(batch, f"x {batch} sequences") if batch != 1 else f
    else:
        batch, ctx, heads, lat, rope = a
        per_core = -(-batch // lnc)  # the cores split the sequences; each runs every head
        key = f"absorbed MLA decode H={heads} L={ctx} latent={lat}+{rope} (one sequence)"
        build = lambda: decode_steps(heads, ctx, lat, rope)  # noqa: E731
        f = store.get_or_price(key, target, 1, "native", us(build), "decode attention")
        f = f.scaled(per_core, f"x {per_core} sequences per core")
    if impl == "ours":
        return replace(f, source=f"{OURS_FALLBACK[op.kind]}; {f.source}")
    return f
