"""What one step of a model runs, as a list of ops per layer kind.

A `Step` is a phase at a shape: training (forward + backward of `batch` sequences of
`seq` tokens per logical core), prefill (forward of the same), or decode (one new token
for each of `batch` sequences over a cache of `context` tokens). Its ops are grouped
into rows of the ledger (attention, MLP / MoE, norms, matmuls left to the compiler);
each op is priced per logical core by `trainium` and `gpu`.

Left out everywhere (and said so in every report): collectives (tensor / data / expert
parallel communication), data loading, the host, compile time, the embedding lookup,
rotary embedding and the residual adds outside the fused norm, the optimizer step,
memory capacity (whether the model and its activations fit a core is not checked).
"""

from __future__ import annotations

from dataclasses import dataclass

from .models import ModelSpec

PHASES = ("train", "prefill", "decode")
LEFT_OUT = (
    "collectives (tensor / data / expert parallel communication)",
    "data loading and the host",
    "compile time",
    "the optimizer step, the embedding lookup, rotary embeddings and residual adds "
    "outside the fused norm",
    "memory capacity (whether weights, activations and the KV cache fit is not checked)",
)


@dataclass(frozen=True)
class Op:
    """One op of a layer. `kind` picks the pricing; `args` its shape."""

    group: str  # the ledger row: "attention", "mlp", "moe", "norms", "matmuls", "head"
    name: str  # what the reader sees, e.g. "flash attention fwd (causal)"
    kind: str  # matmul | attention | decode_attention | norm | swiglu | moe
    args: tuple[object, ...]
    count: int = 1  # identical launches per layer


@dataclass(frozen=True)
class Step:
    phase: str
    batch: int  # sequences per logical core (train / prefill) or per decode step
    seq: int = 0  # tokens per sequence (train / prefill)
    context: int = 0  # cached tokens per sequence (decode)

    @property
    def tokens(self) -> int:
        """Tokens processed (train / prefill) or generated (decode) per step."""
        return self.batch if self.phase == "decode" else self.batch * self.seq

    def describe(self) -> str:
        if self.phase == "decode":
            return f"decode, batch {self.batch}, context {self.context}"
        return f"{self.phase}, {self.batch} x {self.seq} tokens"


def matmuls(group: str, name: str, m: int, k: int, n: int, train: bool) -> list[Op]:
    """x[m, k] W[k, n]; in training also dX = dY W^T and dW = X^T dY."""
    ops = [Op(group, f"{name} fwd", "matmul", (m, k, n))]
    if train:
        ops.append(Op(group, f"{name} dX", "matmul", (m, n, k)))
        ops.append(Op(group, f"{name} dW", "matmul", (k, m, n)))
    return ops


def _mlp(group: str, name: str, t: int, h: int, inter: int, train: bool) -> list[Op]:
    ops = matmuls("matmuls", f"{name} gate_up", t, h, 2 * inter, train)
    ops.append(Op(group, f"{name} silu(g) * u", "swiglu", (t, inter, "fwd")))
    if train:
        ops.append(Op(group, f"{name} silu(g) * u bwd", "swiglu", (t, inter, "bwd")))
    ops += matmuls("matmuls", f"{name} down", t, inter, h, train)
    return ops


def layer_ops(model: ModelSpec, step: Step, moe: bool) -> list[Op]:
    """The ops of one decoder layer (dense MLP, or MoE when `moe`)."""
    train = step.phase == "train"
    t, h = step.tokens, model.hidden
    ops = [Op("norms", "add_rms_norm fwd", "norm", ("add_rms_norm", "fwd", t, h), 2)]
    if train:
        ops.append(Op("norms", "rms_norm bwd", "norm", ("rms_norm", "bwd", t, h), 2))
    if model.is_mla:
        from .mla import layer_ops as mla_ops

        ops += mla_ops(model, step)
    else:
        ops += _attention_ops(model, step)
    if moe:
        ops.append(Op("moe", "MoE layer fwd (router + experts)", "moe", (t, "fwd")))
        if train:
            ops.append(Op("moe", "MoE layer bwd", "moe", (t, "bwd")))
        if model.shared_intermediate:
            ops += _mlp("mlp", "shared expert", t, h, model.shared_intermediate, train)
    else:
        ops += _mlp("mlp", "mlp", t, h, model.intermediate, train)
    return ops


def _attention_ops(model: ModelSpec, step: Step) -> list[Op]:
    """Plain (grouped-query) attention: its projections and the attention op."""
    train = step.phase == "train"
    ops: list[Op] = []
    for name, k, n in model.projections():
        ops += matmuls("matmuls", name, step.tokens, k, n, train)
    a = (model.heads, model.kv_heads, model.head_dim)
    if step.phase == "decode":
        ops.append(
            Op("attention", "decode attention", "decode_attention", (step.batch, step.context, *a))
        )
    else:
        ops.append(
            Op(
                "attention",
                "attention fwd (causal)",
                "attention",
                ("fwd", step.seq, step.batch, *a),
            )
        )
        if train:
            ops.append(
                Op(
                    "attention",
                    "attention bwd (causal)",
                    "attention",
                    ("bwd", step.seq, step.batch, *a),
                )
            )
    return ops


def head_ops(model: ModelSpec, step: Step) -> list[Op]:
    """Once per step: the final norm and the LM head (decode: one row per sequence)."""
    train = step.phase == "train"
    t, h = step.tokens, model.hidden
    rows = t if step.phase != "prefill" else step.batch  # prefill emits one token each
    ops = [Op("head", "final rms_norm fwd", "norm", ("rms_norm", "fwd", t, h))]
    ops += matmuls("head", "lm_head", rows, h, model.vocab, train)
    return ops


def layer_kinds(model: ModelSpec) -> list[tuple[str, int, bool]]:
    """(label, how many, is MoE) for each kind of layer the model has."""
    if not model.is_moe:
        return [("dense layer", model.layers, False)]
    out = []
    if model.dense_layers:
        out.append(("dense layer", model.dense_layers, False))
    out.append(("MoE layer", model.moe_layers, True))
    return out
