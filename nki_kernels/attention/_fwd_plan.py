"""Static layout of the flash-attention forward (plain Python, no NKI calls; see
flash_fwd.py): pipeline lags and ring depths, head_dim chunks, the steps of a query tile
and the runs of consecutive keys inside them, the DMA / TensorE split of the P^T
transposes, and the scale of the running-max chain.
"""

from __future__ import annotations

from typing import Any

from ._staging import GROUP, P

BANK_COLS = 512  # fp32 score columns per PSUM bank (one matmul's N limit on trn2)
FP32_MIN = -3.4028235e38  # the fill value range_select requires (hardware constraint)
PSUM_BANKS = 8
# Pipeline: iterations behind the scores of job i at which each stage runs.
MAX_LAG = 1  # VectorE max pass (scores PSUM -> SBUF)
EXP_LAG = 2  # ScalarE exponential and row sums
TP_LAG = 3  # P^T: DMA transposes issued, PE transposes + evacuation
DMA_KEYS_IN_FLIGHT = 4096  # keys of P^T the DMA engines are given time for before P @ V
Q_PREFETCH = 4  # jobs ahead that a query tile's Q^T DMA is issued
OUT_RING = 6  # finalized tiles waiting for their store DMA
MASK_PREFETCH = 2  # jobs ahead that a dense mask's PARTIAL sub-tiles are loaded
MASK_RING = MASK_PREFETCH + MAX_LAG + 1  # loaded at job i - MASK_PREFETCH, read at i + 1


def n_dchunks(d: int) -> int:
    """128-row contraction chunks of head_dim (Q^T / K^T keep D on partitions)."""
    return (d + P - 1) // P


def dchunks(d: int) -> list:
    """(chunk, first column, rows) of each 128-row head_dim chunk."""
    return [(c, c * P, min(P, d - c * P)) for c in range(n_dchunks(d))]


def o_slots(d: int) -> int:
    """P @ V result slots in the one PSUM bank they share (512 fp32 per partition)."""
    return max(1, BANK_COLS // max(d, P))


def tile_steps(classes: Any, t: int, nk: int, n_sub: int) -> list:
    """Steps of one query tile: lists of (slot, sub-tile u, partial) of <= n_sub slots."""
    subs = []
    for u in range(nk):
        c = classes[t][u] if len(classes) > 0 else 2
        if c != 0:
            subs.append((u, c == 1))
    steps = []
    for s0 in range(0, len(subs), n_sub):
        steps.append(
            [(j, subs[s0 + j][0], subs[s0 + j][1]) for j in range(min(n_sub, len(subs) - s0))]
        )
    return steps


def key_runs(slots: list, split_masked: bool = False) -> list:
    """Maximal runs of consecutive keys inside one 512-slot group: (slot0, u0, count, partial).

    With `split_masked`, PARTIAL and FULL sub-tiles never share a run, so the mask
    instruction (range_select, 2 cycles per element) covers only what needs it.
    """
    runs: list[tuple[int, int, int, bool]] = []
    for j, u, part in slots:
        same = not split_masked or (runs and runs[-1][3] == part)
        if runs and same and runs[-1][1] + runs[-1][2] == u and runs[-1][0] // GROUP == j // GROUP:
            r = runs[-1]
            runs[-1] = (r[0], r[1], r[2] + 1, r[3] or part)
        else:
            runs.append((j, u, 1, part))
    return runs


def dma_split(n_slots: int, n_full: int, dma_quarters: int) -> int:
    """How many leading slots of a step the DMA engines transpose (the rest: TensorE).

    Only full 128-key sub-tiles (the first `n_full` slots) go to the DMA engines.
    """
    return min(n_full, (n_slots * dma_quarters + 2) // 4)


def chain_scale(scale: float) -> tuple[float, float]:
    """(mu, r): the max chain stores S' = mu * S (mu = -min(scale, 1), finite even for the
    FP32_MIN mask fill) and softmax uses scale * S = -r * S'."""
    mu = -min(scale, 1.0)
    return mu, scale / -mu


def step_cols(slots, sk):
    """Score columns of a step: full sub-tiles except possibly a ragged last one."""
    return (len(slots) - 1) * P + min(P, sk - slots[-1][1] * P)
