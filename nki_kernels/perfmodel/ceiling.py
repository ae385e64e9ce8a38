"""Ceiling labels: a modeled fraction above the best published measurement of its kind.

A modeled MFU or bandwidth fraction that exceeds what any published Trainium measurement
of the same kind of work reached is a ceiling of the model (what the rules allow when
everything overlaps), not a result; every table, plot and README figure marks it with
`CEILING` (the one place that decides is `is_ceiling`). The references:

- matmul-bound work: nki-autotune's hand 2048^3 bf16 matmul on trn2, 90.92 % MFU
  (kernel_library README) -- the best measured Trainium kernel of any kind;
- attention, forward or backward: nki-library's attention_cte on trn2, 46 % full-square
  MFU at S = 16384 (nki-autotune learnings; the cost model's anchor) -- no attention
  backward on Trainium is published, and a figure above every measured attention kernel
  is one no measurement supports;
- any other work with TensorE FLOPs (MoE's grouped matmuls, ...): the best matmul;
- bandwidth (fraction of HBM bandwidth): the NKI performance guide's profile "achieving
  close 70% DMA throughput utilization" (nki_perf_guide, memory-bound section), the best
  published DMA utilization of a kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

CEILING = "ceiling"


@dataclass(frozen=True)
class Reference:
    """The best published measurement of one kind of work."""

    fraction: float
    source: str


MATMUL = Reference(
    0.9092,
    "awslabs/nki-autotune @ 0b6f309d kernel_library/README.md: kernel_hand_90.92mfu, "
    "2048^3 bf16 on trn2, 90.92 % MFU",
)
ATTENTION = Reference(
    0.46,
    "awslabs/nki-autotune @ d57bcc3b .claude/rules/learnings.md: nki-library attention_cte, "
    "D = 128 bf16 causal, S = 16384 on trn2, 46 % full-square MFU",
)
BANDWIDTH = Reference(
    0.70,
    "aws-neuron/aws-neuron-sdk nki/deep-dives/nki_perf_guide.rst: a profile 'achieving close "
    "70% DMA throughput utilization'",
)


def mfu_reference(op: str) -> Reference:
    """The reference for an op's MFU (its kind by name: attention, or else the best
    measured matmul, the best Trainium kernel of any kind)."""
    if "attention" in op.lower():
        return ATTENTION
    return MATMUL


def is_ceiling(op: str, mfu: float | None = None, hbm_fraction: float | None = None) -> bool:
    """Whether a modeled MFU (or, without one, bandwidth fraction) of `op` exceeds the best
    published measurement of its kind."""
    if mfu is not None:
        return mfu > mfu_reference(op).fraction
    if hbm_fraction is not None:
        return hbm_fraction > BANDWIDTH.fraction
    return False


def label(text: str, op: str, mfu: float | None = None, hbm_fraction: float | None = None) -> str:
    """`text` followed by ' ceiling' when the figure is a ceiling (`is_ceiling`)."""
    if text and is_ceiling(op, mfu, hbm_fraction):
        return f"{text} {CEILING}"
    return text
