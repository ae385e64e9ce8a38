"""`nki-kernels parity --nproc N`: the golden-batch check at the smallest distributed scale.

`launch()` starts N processes with torchrun (`torch.distributed.run`); each runs
`main()`: a gloo process group on CPU, the model wrapped in DistributedDataParallel, each
rank training on its rows of every batch (rows rank::N). It runs the reference and the
NKI path N steps each (same seed, same data order) and checks, after every step, that
the parameters are identical on all ranks (gradients stayed synchronized through the
ops' backward). Rank 0 writes the report: per-step mean loss over ranks for both paths,
their deltas against the tolerance, and the synchronization check. The tolerance is the
single-process rule's ulp term (16 fp32 ulps of the first loss): there are no
noise-floor runs here, so this mode is for fp32 models (or pass --tolerance).

Not covered yet: FSDP2 (`fully_shard`) and a sharded (torch.distributed.checkpoint)
save / reload mid-run.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .harness import tolerance_for


def _entry(spec: str) -> Any:
    from .data import BUILTIN as DATA
    from .models import BUILTIN as MODELS

    if spec in MODELS:
        return MODELS[spec]
    if spec in DATA:
        return DATA[spec]
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def _shard(batch: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    return {k: v[rank::world] if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _digest(model: nn.Module) -> torch.Tensor:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return torch.tensor(list(h.digest()[:8]), dtype=torch.int64)


def _train(model: nn.Module, data: Any, seed: int, steps: int, lr: float) -> tuple[list, bool]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    ddp = DDP(model.train())
    opt = torch.optim.AdamW(ddp.parameters(), lr=lr, foreach=False)
    losses, in_sync = [], True
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        out = ddp(**_shard(data(seed, step), rank, world))
        loss = out.loss if hasattr(out, "loss") else out
        loss.backward()
        opt.step()
        mean = loss.detach().float().clone()
        dist.all_reduce(mean)
        losses.append(float(mean) / world)
        digests = [torch.zeros(8, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(digests, _digest(model))
        in_sync &= all(torch.equal(d, digests[0]) for d in digests)
    return losses, in_sync


def main(argv: list[str] | None = None) -> int:
    """One rank of the distributed check (started by torchrun)."""
    import nki_kernels

    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--tolerance", type=float, default=None)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    dist.init_process_group("gloo")
    factory, data = _entry(a.model), _entry(a.data)
    ref, ref_sync = _train(factory(seed=a.seed), data, a.seed, a.steps, a.lr)
    cand_model = factory(seed=a.seed)
    nki_kernels.patch(cand_model)
    cand, cand_sync = _train(cand_model, data, a.seed, a.steps, a.lr)
    if dist.get_rank() == 0:
        tol, _ = tolerance_for(0.0, ref[0], torch.float32)
        rule = "16 x eps(float32) x |loss0| (no noise-floor runs under --nproc)"
        if a.tolerance is not None:
            tol, rule = a.tolerance, "given (--tolerance)"
        deltas = [abs(x - y) for x, y in zip(cand, ref)]
        first = next((i for i, d in enumerate(deltas) if not d <= tol), None)
        report = {
            "model": a.model,
            "world_size": dist.get_world_size(),
            "backend": "gloo (CPU), DistributedDataParallel",
            "steps": a.steps,
            "tolerance": tol,
            "tolerance_rule": rule,
            "reference_losses": ref,
            "candidate_losses": cand,
            "deltas": deltas,
            "first_divergent_step": first,
            "params_in_sync": {"reference": ref_sync, "candidate": cand_sync},
            "passed": first is None and ref_sync and cand_sync,
        }
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(report, indent=1) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    return 0


def launch(
    nproc: int,
    model: str,
    data: str,
    steps: int,
    seed: int,
    lr: float,
    tolerance: float | None,
    out: Path,
) -> dict[str, Any]:
    """Run `main` on `nproc` CPU processes with torchrun; returns rank 0's report."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "nki_kernels.parity.distributed",
        "--model",
        model,
        "--data",
        data,
        "--steps",
        str(steps),
        "--seed",
        str(seed),
        "--lr",
        str(lr),
        "--out",
        str(out),
    ]
    if tolerance is not None:
        cmd += ["--tolerance", str(tolerance)]
    subprocess.run(cmd, check=True)
    return json.loads(out.read_text())


if __name__ == "__main__":
    sys.exit(main())
