"""The blockwise MoE kernels with gate and up as two weight tensors (TorchTitan's w1 / w3).

`moe_mlp_fwd` / `moe_mlp_bwd` take the up weight as a trailing `w_up` (and its gradient
`dw_up`); a launch passes tensors positionally ahead of the config's keyword fields, so
these entry points put them next to the gate's and run the same kernel bodies
(`moe_mlp_fwd_body` / `moe_mlp_bwd_body`, undecorated helpers traced inline: the same
instructions, param_layout.py). Only entry points carry `@nki.jit`; none calls another.
"""

from __future__ import annotations

from ..nki import nki
from .blockwise_mlp import moe_mlp_fwd_body
from .blockwise_mlp_bwd import moe_mlp_bwd_body


@nki.jit
def moe_mlp_fwd_split(
    hidden,
    w_gate,
    w_up,
    w_down,
    slot_token,
    block_expert,
    kind_bounds,
    token_slot,
    token_weight,
    save_cols,
    save_holes,
    static_kinds,
    may_drop,
    block_size,
    tile_i,
    loop_order,
    down_n,
    w_bufs,
    dma_h,
    static_holes=None,
    transposed=(False, False),
):
    """`moe_mlp_fwd` with the gate [E, H, I] and up [E, H, I] weights as two tensors (each
    [E, I, H] when `transposed[0]`)."""
    return moe_mlp_fwd_body(
        hidden, w_gate, w_down, slot_token, block_expert, kind_bounds, token_slot, token_weight,
        save_cols, save_holes, static_kinds, may_drop, block_size, tile_i, loop_order, down_n,
        w_bufs, dma_h, static_holes, w_up, transposed,
    )  # fmt: skip


@nki.jit
def moe_mlp_bwd_split(
    hidden,
    w_gate,
    w_up,
    w_down,
    dout,
    slot_token,
    slot_weight,
    block_expert,
    block_keep,
    block_count,
    token_slot,
    dw_gate,
    dw_up,
    dw_down,
    gate_up,
    static_blocks,
    may_drop,
    block_size,
    sub_block,
    tile_i,
    dma_h,
    w_bufs,
    wgrad_tiles,
    wgrad_cols,
    strip_bufs,
    prefetch_rows,
    transposed=(False, False),
):
    """`moe_mlp_bwd` with gate and up (and their gradients, written in place) as two
    tensors."""
    return moe_mlp_bwd_body(
        hidden, w_gate, w_down, dout, slot_token, slot_weight, block_expert, block_keep,
        block_count, token_slot, dw_gate, dw_down, gate_up, static_blocks, may_drop,
        block_size, sub_block, tile_i, dma_h, w_bufs, wgrad_tiles, wgrad_cols, strip_bufs,
        prefetch_rows, w_up, dw_up, transposed,
    )  # fmt: skip
