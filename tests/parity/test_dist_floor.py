"""`parity --nproc`: the noise floor and tolerance fixed before the NKI runs, and when the
one-process run is the same objective as the ranks' mean loss."""

from __future__ import annotations

import pytest
import torch

from nki_kernels.parity.dist_rank import floor_tolerance
from nki_kernels.parity.distributed import same_objective
from nki_kernels.parity.titan import titan_batches


def _runs(ref, ddp_alt, fsdp_alt):
    runs = {"ddp/reference": ref, "fsdp2/reference": ref, "ddp/alternative": ddp_alt}
    runs["fsdp2/alternative"] = fsdp_alt
    return {k: {"losses": v} for k, v in runs.items()}


def test_floor_is_the_largest_gap_of_the_correct_pairs_and_sets_the_tolerance() -> None:
    ref = [8.0, 7.0, 6.0]
    runs = _runs(ref, [8.0, 7.0001, 6.0], [8.0, 7.0, 6.0003])
    t = floor_tolerance(runs, [8.0, 7.0, 6.0002], None, 2)
    assert t["floor_parts"]["ddp: reference vs alternative"] == pytest.approx(1e-4, rel=1e-3)
    assert t["floor_parts"]["fsdp2: 2 processes vs 1"] == pytest.approx(2e-4, rel=1e-3)
    assert t["floor"] == pytest.approx(3e-4, rel=1e-3)
    assert t["value"] == pytest.approx(9e-4, rel=1e-3)  # 3 x floor
    assert "3 x noise floor" in t["rule"]
    without_single = floor_tolerance(_runs(ref, ref, ref), None, None, 2)
    assert set(without_single["floor_parts"]) == {
        "ddp: reference vs alternative",
        "fsdp2: reference vs alternative",
    }
    ulp = 16 * torch.finfo(torch.float32).eps * 8.0
    assert without_single["value"] == pytest.approx(ulp)  # floor 0: the fp32 ulp term
    given = floor_tolerance(runs, None, 0.5, 2)
    assert given["value"] == 0.5 and given["rule"] == "given (--tolerance)"


def test_one_process_run_only_where_the_ranks_hold_equal_loss_positions() -> None:
    assert same_objective(titan_batches, 0, 4, 2) is None  # packed documents, no padding

    def padded(seed, step):
        labels = torch.arange(24).view(4, 6)
        labels[1, :3] = -100  # rank 1 holds rows 1 and 3: fewer loss positions
        return {"input_ids": labels.clamp(min=0), "labels": labels}

    assert "loss positions" in same_objective(padded, 0, 1, 2)

    def rows(seed, step):
        return {"x": torch.zeros(5, 3), "y": torch.zeros(5, 1)}

    assert "rows" in same_objective(rows, 0, 1, 2)
    assert same_objective(lambda s, i: {"x": torch.zeros(4, 3)}, 0, 1, 2) is None
