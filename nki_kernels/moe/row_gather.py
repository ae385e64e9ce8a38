"""Row gathers of an MoE layer's dispatch and combine, in NKI (`moe_gated_experts`).

`gather_rows_sum(src [N, H], index [M, k] int32, weight [M, k] fp32 | None, out_dtype)`:

    out[m] = sum_j weight[m, j] * src[index[m, j]]      (weight None: the plain sum)

- dispatch: x_sorted[r] = hidden[token of r] (k = 1, no weight);
- combine: out[t] = sum_j w[t, j] y[slot(t, j)] (fp32 out, one rounding per row);
- their backwards: d hidden[t] = sum_j d x_sorted[slot(t, j)] and d y[r] = w_r d out[t].

`gather_rows_dot(a [M, H], src [N, H], index [M, k] int32)`: out[m, j] = <a[m],
src[index[m, j]]> in fp32 (the combine's weight gradient, d w[t, j] = <d out[t], y_slot>).

An index outside [0, N) (the caller's "nothing here": N) gathers a zero row: every
gathered tile is zeroed (GpSimd memset) and the indirect DMA skips out-of-bounds rows
(`oob_mode.skip`), so such a slot adds an exact 0 and reads nothing (no multiply of a
row by a 0 weight: a NaN / Inf elsewhere never reaches it). Each output row reads only
its own indices, weights and rows, so a NaN stays in the rows that gather it.

Per tile of 128 output rows (rows on partitions; LNC 2: the programs take alternate
tiles) and chunk of <= COLS columns: each slot's rows gathered by one indirect DMA
(each partition reads its own row), then acc = w_0 y_0 (ScalarE copy with a
per-partition scale), acc = w_j y_j + acc (VectorE), fp32, one rounding on the store;
a plain gather (k = 1, no weight, the source's dtype out) stores the gathered tile.
Limits: any M, N, H; k <= 16 (routing's top-k, plus one).
"""

from __future__ import annotations

from typing import Any

from ..nki import nisa, nki, nl

P = 128
COLS = 2048  # columns per chunk: fp32 tiles of 8 KiB per partition, >= 2 KiB per DMA row


def _programs() -> tuple[int, int]:
    if nl.program_ndim() == 0:
        return 0, 1
    return nl.program_id(0), nl.num_programs(0)


def _gather(src: Any, idx: Any, j: int, rows: int, c0: int, cw: int) -> Any:
    """[128, COLS] of src's dtype: rows src[idx[:, j]], columns c0 .. c0 + cw (zeros for
    an index outside src)."""
    h = src.shape[1]
    r = slice(0, rows)
    y = nl.ndarray((P, COLS), dtype=src.dtype, buffer=nl.sbuf)
    nisa.memset(dst=y[r, 0:cw], value=0.0, engine=nisa.engine.gpsimd)
    view = src.ap([[h, rows], [1, cw]], offset=c0, vector_offset=idx[r, j : j + 1], indirect_dim=0)
    nisa.dma_copy(dst=y[r, 0:cw], src=view, oob_mode=nisa.oob_mode.skip)
    return y


def _load_index(index: Any, t0: int, rows: int) -> Any:
    k = index.shape[1]
    idx = nl.ndarray((P, k), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx[0:rows], src=index[t0 : t0 + rows, :])
    return idx


@nki.jit
def gather_rows_sum(src, index, weight, out_dtype):
    """out [M, H] (out_dtype); see the module docstring."""
    h = src.shape[1]
    m, k = index.shape
    out = nl.ndarray((m, h), dtype=out_dtype, buffer=nl.shared_hbm)
    cols = min(COLS, h)
    pid, nprog = _programs()
    for t0 in range(pid * P, m, nprog * P):
        rows = min(P, m - t0)
        r = slice(0, rows)
        idx = _load_index(index, t0, rows)
        wt = None
        if weight is not None:
            wt = nl.ndarray((P, k), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=wt[r], src=weight[t0 : t0 + rows, :])
        for c0 in range(0, h, cols):
            cw = min(cols, h - c0)
            if k == 1 and wt is None and out_dtype == src.dtype:
                # a plain gather (dispatch): the gathered rows are the output rows
                y = _gather(src, idx, 0, rows, c0, cw)
                nisa.dma_copy(dst=out[t0 : t0 + rows, c0 : c0 + cw], src=y[r, 0:cw])
                continue
            acc = nl.ndarray((P, COLS), dtype=nl.float32, buffer=nl.sbuf)
            for j in range(k):
                y = _gather(src, idx, j, rows, c0, cw)
                a, b = acc[r, 0:cw], y[r, 0:cw]
                if j == 0 and wt is None:
                    nisa.tensor_copy(dst=a, src=b, engine=nisa.engine.scalar)
                elif j == 0:
                    nisa.activation(dst=a, op=nl.copy, data=b, scale=wt[r, 0:1])
                elif wt is None:
                    nisa.tensor_tensor(dst=a, data1=b, data2=a, op=nl.add)
                else:
                    nisa.scalar_tensor_tensor(
                        dst=a, data=b, op0=nl.multiply, operand0=wt[r, j : j + 1], op1=nl.add,
                        operand1=a,
                    )  # fmt: skip
            if out_dtype == nl.float32:
                nisa.dma_copy(dst=out[t0 : t0 + rows, c0 : c0 + cw], src=acc[r, 0:cw])
            else:
                res = nl.ndarray((P, COLS), dtype=out_dtype, buffer=nl.sbuf)
                nisa.tensor_copy(dst=res[r, 0:cw], src=acc[r, 0:cw])  # one rounding
                nisa.dma_copy(dst=out[t0 : t0 + rows, c0 : c0 + cw], src=res[r, 0:cw])
    return out


@nki.jit
def gather_rows_dot(a, src, index):
    """out [M, k] fp32: out[m, j] = <a[m], src[index[m, j]]> (0 for an index outside src)."""
    m, h = a.shape
    k = index.shape[1]
    out = nl.ndarray((m, k), dtype=nl.float32, buffer=nl.shared_hbm)
    cols = min(COLS, h)
    pid, nprog = _programs()
    for t0 in range(pid * P, m, nprog * P):
        rows = min(P, m - t0)
        r = slice(0, rows)
        idx = _load_index(index, t0, rows)
        dots = nl.ndarray((P, k), dtype=nl.float32, buffer=nl.sbuf)
        part = nl.ndarray((P, k), dtype=nl.float32, buffer=nl.sbuf)
        for c0 in range(0, h, cols):
            cw = min(cols, h - c0)
            at = nl.ndarray((P, COLS), dtype=a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=at[r, 0:cw], src=a[t0 : t0 + rows, c0 : c0 + cw])
            prod = nl.ndarray((P, COLS), dtype=nl.float32, buffer=nl.sbuf)
            dst = dots if c0 == 0 else part
            for j in range(k):
                y = _gather(src, idx, j, rows, c0, cw)
                nisa.tensor_tensor(dst=prod[r, 0:cw], data1=at[r, 0:cw], data2=y[r, 0:cw],
                                   op=nl.multiply)  # fmt: skip
                nisa.tensor_reduce(dst=dst[r, j : j + 1], op=nl.add, data=prod[r, 0:cw], axis=(1,))
            if c0 > 0:
                nisa.tensor_tensor(dst=dots[r], data1=dots[r], data2=part[r], op=nl.add)
        nisa.dma_copy(dst=out[t0 : t0 + rows, :], src=dots[r])
    return out
