"""Expert activations with per-expert biases, between the two grouped matmuls of an MoE.

The expert rows arrive sorted by expert (the layout of `torch.ops.nki.grouped_mm`): row r
holds z_r = x_r W_e (2I columns: gate and up) of expert e = row_group[r]. Forward:

    z      = h + bias[row_group[r]]              bias rows gathered by indirect DMA
    gate, up = z[:, :I], z[:, I:]                ("halves": Mixtral / Qwen / DeepSeek)
             | z[:, 0::2], z[:, 1::2]            ("interleaved": GPT-OSS's gate_up_proj)
    out    = silu(gate) * up                     "swiglu"
           | gelu(gate) * up                     "geglu" (exact, erf)
           | (clamp(up, -L, L) + 1) * g * sigmoid(alpha * g),  g = min(gate, L)
                                                 "gpt_oss" (transformers' GptOssExperts)
           | z                                   "none" (the bias alone: down_proj's)

Per tile of 128 rows (rows on partitions; LNC 2: the programs take alternate tiles) and
chunk of <= COLS (2048) output columns: the chunk's gate and up columns of h loaded (one
contiguous run interleaved, two runs for halves), the bias rows gathered by each
partition's group id and added in h's dtype (as torch's x @ W + b rounds), the
activation on ScalarE, the products on VectorE (fp32 math, fp32 intermediates), one
rounding on the store.

Backward (`expert_act_bwd`, d out -> d z = d h; d bias is the per-expert sum of d z,
which the op computes with grouped_mm's weight-gradient kernel):

    swiglu:  d gate = d * up * silu'(gate),  d up = d * silu(gate)
    geglu:   d gate = d * up * gelu'(gate),  d up = d * gelu(gate)
    gpt_oss: s = sigmoid(alpha g), d up = d * g * s           where |up| <= L, else 0
             d gate = d * (u + 1) * (s + alpha g s (1 - s))   where gate <= L, else 0

The clamps' zero gradients are selects (predicated copies over zeros), as torch's
clamp backward selects: a NaN pre-activation compares false and gets 0 there, as in
torch; an Inf gradient is never multiplied by a 0. Every row reads only its own values and
its own expert's bias row, so a NaN / Inf stays in its row. Limits: any M, any even 2I
(halves / interleaved), G any size; fp32, bf16 or fp16 h and bias.
"""

from __future__ import annotations

from typing import Any

from ..nki import nisa, nki, nl

P = 128  # rows per tile: one row per partition
COLS = 2048  # output columns per chunk: >= 2 KiB per partition per DMA (fp32 tiles 8 KiB)
ACTIVATIONS = ("none", "swiglu", "geglu", "gpt_oss")


def _programs() -> tuple[int, int]:
    if nl.program_ndim() == 0:
        return 0, 1
    return nl.program_id(0), nl.num_programs(0)


@nki.jit
def expert_act_fwd(h, bias, row_group, activation, interleaved, alpha, limit):
    """out [M, I] (h's dtype; [M, N] for "none") from h [M, 2I or N], bias [G, 2I or N]
    (or None), row_group [M, 1] int32 (each row's expert, in [0, G))."""
    m, n2 = h.shape
    assert activation in ACTIVATIONS, "expert_act_fwd: unknown activation"
    gated = activation != "none"
    width = n2 // 2 if gated else n2
    out = nl.ndarray((m, width), dtype=h.dtype, buffer=nl.shared_hbm)
    pid, nprog = _programs()
    for t0 in range(pid * P, m, nprog * P):
        rows = min(P, m - t0)
        r = slice(0, rows)
        rg = _row_groups(row_group, bias, t0, rows)
        for c0 in range(0, width, COLS):
            cw = min(COLS, width - c0)
            z = _load_z(h, bias, rg, t0, rows, c0, cw, gated, interleaved)
            res = z
            if gated:
                res = nl.ndarray((P, COLS), dtype=h.dtype, buffer=nl.sbuf)
                gate, up = _halves(z, rows, cw, interleaved)
                _gated_fwd(res[r, 0:cw], gate, up, activation, alpha, limit, rows, cw)
            nisa.dma_copy(dst=out[t0 : t0 + rows, c0 : c0 + cw], src=res[r, 0:cw])
    return out


@nki.jit
def expert_act_bwd(h, bias, row_group, d_out, activation, interleaved, alpha, limit):
    """d_h [M, 2I] (h's dtype, h's layout) of a gated `expert_act_fwd`, from d_out [M, I]."""
    m, n2 = h.shape
    assert activation in ACTIVATIONS and activation != "none", "expert_act_bwd: gated only"
    width = n2 // 2
    d_h = nl.ndarray((m, n2), dtype=h.dtype, buffer=nl.shared_hbm)
    pid, nprog = _programs()
    for t0 in range(pid * P, m, nprog * P):
        rows = min(P, m - t0)
        r = slice(0, rows)
        rg = _row_groups(row_group, bias, t0, rows)
        for c0 in range(0, width, COLS):
            cw = min(COLS, width - c0)
            z = _load_z(h, bias, rg, t0, rows, c0, cw, True, interleaved)
            gate, up = _halves(z, rows, cw, interleaved)
            d = nl.ndarray((P, COLS), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=d[r, 0:cw], src=d_out[t0 : t0 + rows, c0 : c0 + cw])
            dz = nl.ndarray((P, 2 * COLS), dtype=nl.float32, buffer=nl.sbuf)
            d_gate, d_up = _halves(dz, rows, cw, interleaved)
            _gated_bwd(d_gate, d_up, gate, up, d[r, 0:cw], activation, alpha, limit, rows, cw)
            dzc = nl.ndarray((P, 2 * COLS), dtype=h.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=dzc[r, 0 : 2 * cw], src=dz[r, 0 : 2 * cw])  # one rounding
            _store_z(d_h, dzc, t0, rows, c0, cw, interleaved)
    return d_h


def _row_groups(row_group: Any, bias: Any, t0: int, rows: int) -> Any:
    """[128, 1] int32 group ids of rows t0 .. t0 + rows (None without a bias)."""
    if bias is None:
        return None
    rg = nl.ndarray((P, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=rg[0:rows, :], src=row_group[t0 : t0 + rows, :])
    return rg


def _load_z(
    h: Any,
    bias: Any,
    rg: Any,
    t0: int,
    rows: int,
    c0: int,
    cw: int,
    gated: bool,
    interleaved: bool,
) -> Any:
    """[128, 2 * COLS] of h's dtype: columns 0 .. 2cw hold the chunk's (gate, up) pairs in
    h's layout (interleaved: one contiguous run; halves: gate then up), bias added."""
    r = slice(0, rows)
    n2 = h.shape[1]
    width = n2 // 2 if gated else n2
    raw = nl.ndarray((P, 2 * COLS), dtype=h.dtype, buffer=nl.sbuf)
    b = None
    if bias is not None:
        b = nl.ndarray((P, 2 * COLS), dtype=bias.dtype, buffer=nl.sbuf)
    used = 0
    for dst0, src0, n in _spans(c0, cw, width, gated, interleaved):
        used += n
        nisa.dma_copy(dst=raw[r, dst0 : dst0 + n], src=h[t0 : t0 + rows, src0 : src0 + n])
        if b is not None:
            # each partition reads its own expert's bias row (indirect on dim 0)
            view = bias.ap(
                [[n2, rows], [1, n]], offset=src0, vector_offset=rg[r, 0:1], indirect_dim=0
            )
            nisa.dma_copy(dst=b[r, dst0 : dst0 + n], src=view)
    if b is None:
        return raw
    # h + b rounded to h's dtype, as torch's x @ W + b is (and all-16-bit VectorE operands)
    nisa.tensor_tensor(dst=raw[r, 0:used], data1=raw[r, 0:used], data2=b[r, 0:used], op=nl.add)
    return raw


def _spans(c0: int, cw: int, width: int, gated: bool, interleaved: bool) -> list[tuple[int, ...]]:
    """(tile column, h column, count) runs of output chunk c0 .. c0 + cw."""
    if not gated:
        return [(0, c0, cw)]
    if interleaved:
        return [(0, 2 * c0, 2 * cw)]
    return [(0, c0, cw), (cw, width + c0, cw)]


def _halves(z: Any, rows: int, cw: int, interleaved: bool) -> tuple[Any, Any]:
    """(gate, up) views [rows, cw] of a (gate, up) tile filled by `_load_z`."""
    r = slice(0, rows)
    if interleaved:
        return z[r, 0 : 2 * cw : 2], z[r, 1 : 2 * cw : 2]
    return z[r, 0:cw], z[r, cw : 2 * cw]


def _store_z(d_h: Any, dz: Any, t0: int, rows: int, c0: int, cw: int, interleaved: bool) -> None:
    r = slice(0, rows)
    width = d_h.shape[1] // 2
    for dst0, src0, n in _spans(c0, cw, width, True, interleaved):
        nisa.dma_copy(dst=d_h[t0 : t0 + rows, src0 : src0 + n], src=dz[r, dst0 : dst0 + n])


def _tile(dtype: Any = nl.float32) -> Any:
    return nl.ndarray((P, COLS), dtype=dtype, buffer=nl.sbuf)


def _clamped(gate: Any, up: Any, limit: float, rows: int, cw: int) -> tuple[Any, Any]:
    """(min(gate, L), clamp(up, -L, L)) as fp32 [128, COLS] tiles."""
    r = slice(0, rows)
    g = _tile()
    nisa.tensor_scalar(dst=g[r, 0:cw], data=gate, op0=nl.minimum, operand0=limit)
    u = _tile()
    nisa.tensor_scalar(
        dst=u[r, 0:cw], data=up, op0=nl.minimum, operand0=limit, op1=nl.maximum, operand1=-limit
    )
    return g, u


def _gated_fwd(
    res: Any, gate: Any, up: Any, activation: str, alpha: float, limit: float, rows: int, cw: int
) -> None:
    r = slice(0, rows)
    a = _tile()
    if activation == "gpt_oss":
        g, u = _clamped(gate, up, limit, rows, cw)
        nisa.activation(dst=a[r, 0:cw], op=nl.sigmoid, data=g[r, 0:cw], scale=alpha)
        nisa.tensor_tensor(dst=a[r, 0:cw], data1=a[r, 0:cw], data2=g[r, 0:cw], op=nl.multiply)
        # (u + 1) * glu
        nisa.scalar_tensor_tensor(
            dst=res, data=u[r, 0:cw], op0=nl.add, operand0=1.0, op1=nl.multiply, operand1=a[r, 0:cw]
        )
        return
    op = nl.silu if activation == "swiglu" else nl.gelu
    nisa.activation(dst=a[r, 0:cw], op=op, data=gate)
    nisa.tensor_tensor(dst=res, data1=a[r, 0:cw], data2=up, op=nl.multiply)


def _gated_bwd(
    d_gate: Any,
    d_up: Any,
    gate: Any,
    up: Any,
    d: Any,
    activation: str,
    alpha: float,
    limit: float,
    rows: int,
    cw: int,
) -> None:
    r = slice(0, rows)
    if activation != "gpt_oss":
        op, op_dx = (nl.silu, nl.silu_dx) if activation == "swiglu" else (nl.gelu, nl.gelu_dx)
        a = _tile()
        nisa.activation(dst=a[r, 0:cw], op=op, data=gate)
        nisa.tensor_tensor(dst=d_up, data1=a[r, 0:cw], data2=d, op=nl.multiply)
        nisa.activation(dst=a[r, 0:cw], op=op_dx, data=gate)
        nisa.tensor_tensor(dst=a[r, 0:cw], data1=a[r, 0:cw], data2=up, op=nl.multiply)
        nisa.tensor_tensor(dst=d_gate, data1=a[r, 0:cw], data2=d, op=nl.multiply)
        return
    g, u = _clamped(gate, up, limit, rows, cw)
    s = _tile()
    nisa.activation(dst=s[r, 0:cw], op=nl.sigmoid, data=g[r, 0:cw], scale=alpha)
    # d up = d * g * s, selected where |up| <= L
    val = _tile()
    nisa.tensor_tensor(dst=val[r, 0:cw], data1=g[r, 0:cw], data2=s[r, 0:cw], op=nl.multiply)
    nisa.tensor_tensor(dst=val[r, 0:cw], data1=val[r, 0:cw], data2=d, op=nl.multiply)
    keep = _tile(nl.uint8)
    nisa.tensor_scalar(
        dst=keep[r, 0:cw], data=up, op0=nl.abs, operand0=None, op1=nl.less_equal, operand1=limit
    )
    _select(d_up, val[r, 0:cw], keep[r, 0:cw])
    # d gate = d * (u + 1) * (s + alpha g s (1 - s)), selected where gate <= L
    t = _tile()
    nisa.tensor_tensor(dst=t[r, 0:cw], data1=s[r, 0:cw], data2=s[r, 0:cw], op=nl.multiply)
    nisa.tensor_tensor(dst=t[r, 0:cw], data1=s[r, 0:cw], data2=t[r, 0:cw], op=nl.subtract)
    nisa.scalar_tensor_tensor(
        dst=t[r, 0:cw], data=g[r, 0:cw], op0=nl.multiply, operand0=alpha, op1=nl.multiply,
        operand1=t[r, 0:cw],
    )  # fmt: skip
    nisa.tensor_tensor(dst=t[r, 0:cw], data1=t[r, 0:cw], data2=s[r, 0:cw], op=nl.add)
    nisa.scalar_tensor_tensor(
        dst=val[r, 0:cw], data=u[r, 0:cw], op0=nl.add, operand0=1.0, op1=nl.multiply,
        operand1=t[r, 0:cw],
    )  # fmt: skip
    nisa.tensor_tensor(dst=val[r, 0:cw], data1=val[r, 0:cw], data2=d, op=nl.multiply)
    nisa.tensor_scalar(dst=keep[r, 0:cw], data=gate, op0=nl.less_equal, operand0=limit)
    _select(d_gate, val[r, 0:cw], keep[r, 0:cw])


def _select(dst: Any, val: Any, keep: Any) -> None:
    """dst = val where keep, else 0 (a select: val's Inf / NaN never meets a 0 factor)."""
    nisa.memset(dst=dst, value=0.0)
    nisa.tensor_copy_predicated(dst=dst, src=val, predicate=keep)
