"""Built-in data factory of the harness: deterministic token batches per (seed, step)."""

from __future__ import annotations

from typing import Any

import torch

from .models import VOCAB

BATCH, SEQ, PAD, POOL = 4, 32, 5, 4


def tiny_lm_batches(seed: int, step: int) -> dict[str, Any]:
    """A causal-LM batch [4, 32] for `step`: random tokens (ids 3..VOCAB-1), the last row
    left-padded by 5 (pad id 0, masked out of the loss), labels = input ids. Steps cycle
    through a pool of 4 batches, so a tiny model's loss visibly falls in 20 steps."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step % POOL)
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=g)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[-1, :PAD] = 0
    ids[-1, :PAD] = 0
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def packed_docs_batches(seed: int, step: int) -> dict[str, Any]:
    """TorchTitan models' batches (`titan.titan_batches`: packed documents)."""
    from .titan import titan_batches

    return titan_batches(seed, step)


BUILTIN = {"tiny-lm": tiny_lm_batches, "packed-docs": packed_docs_batches}

__all__ = ["BUILTIN", "packed_docs_batches", "tiny_lm_batches"]
