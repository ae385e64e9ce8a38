"""One rank of `nki-kernels parity --nproc N` (started by torchrun; see `distributed`).

Phase "train": for each model, under each wrapper (DistributedDataParallel, then FSDP2
`fully_shard`), the reference path and the NKI path train N steps each (same seed, same
data order, each rank on its rows `rank::N` of every batch). After every step the full
parameters are hashed on every rank and the hashes compared, and the non-finite
gradient elements counted (under DDP the parameters
are replicas, so gradients that stayed synchronized keep them bit-identical; under FSDP2
each rank gathers the shards, so the check is that the gathered model is one model). The
NKI run saves a sharded checkpoint (`torch.distributed.checkpoint`, model and optimizer
state dicts from `get_state_dict`) before step N // 2.

Phase "resume" (fresh processes, fresh models): each NKI run's checkpoint is loaded into
a freshly built, patched and wrapped model and a fresh optimizer (`set_state_dict`),
which then runs steps N // 2 .. N-1.

Rank 0 writes each phase's per-step mean losses (over ranks) as JSON; `distributed`
merges the two phases into the report.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

WRAPPERS = ("ddp", "fsdp2")
PATHS = ("reference", "nki")


def tolerance_of(loss0: float, given: float | None) -> tuple[float, str]:
    """The --nproc tolerance on |Δloss| and its rule: 16 fp32 ulps of the reference's
    first loss (no noise-floor runs here), or the given value."""
    from .harness import ULPS, tolerance_for

    if given is not None:
        return float(given), "given (--tolerance)"
    tol, _ = tolerance_for(0.0, loss0, torch.float32)
    return tol, f"{ULPS} x eps(float32) x |reference loss0| (no noise-floor runs under --nproc)"


def entry(spec: str) -> Any:
    """A built-in model / data factory by name, or `module:function`."""
    from .data import BUILTIN as DATA
    from .models import BUILTIN as MODELS
    from .models import special_factory

    special = special_factory(spec)
    if special is not None:
        return special
    if spec in MODELS:
        return MODELS[spec]
    if spec in DATA:
        return DATA[spec]
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def _shard(batch: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    return {k: v[rank::world] if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _nonfinite(model: nn.Module, sharded: bool) -> int:
    """Non-finite gradient elements of the whole model: FSDP2 ranks hold disjoint shards
    (summed), DDP ranks hold the same reduced gradients (the largest count)."""
    from torch.distributed.tensor import DTensor

    count = torch.zeros((), dtype=torch.int64)
    for p in model.parameters():
        g = p.grad
        if g is not None:
            local = g.to_local() if isinstance(g, DTensor) else g
            count += (~torch.isfinite(local.detach())).sum()
    dist.all_reduce(count, op=dist.ReduceOp.SUM if sharded else dist.ReduceOp.MAX)
    return int(count)


def _digest(model: nn.Module) -> torch.Tensor:
    """A hash of the full parameters (gathered under FSDP2), from private copies."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(_full(p.detach()).float().clone().numpy().tobytes())
    return torch.tensor(list(h.digest()[:8]), dtype=torch.int64)


def _build(factory: Any, seed: int, patched: bool, wrapper: str) -> tuple[nn.Module, nn.Module]:
    """(the module to call, the module holding the parameters) for one run."""
    import nki_kernels

    if getattr(factory, "builds_nki", False):
        model = factory(seed=seed, nki=patched)
    else:
        model = factory(seed=seed)
        if patched:
            nki_kernels.patch(model)
    model.train()
    if getattr(factory, "titan_name", None) and wrapper == "fsdp2":
        return _titan_fsdp(model), model
    if wrapper == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model), model
    from torch.distributed.fsdp import fully_shard

    layers = getattr(getattr(model, "model", None), "layers", None)
    for layer in layers if isinstance(layers, nn.ModuleList) else ():
        fully_shard(layer)  # one all-gather / reduce-scatter group per decoder layer
    fully_shard(model)
    return model, model


def _titan_fsdp(lm: Any) -> nn.Module:
    """TorchTitan's own activation checkpointing (FullAC, every block) and FSDP2
    (`apply_fsdp_to_decoder`, fp32, one group per block) on a 1-D CPU mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torchtitan.distributed.activation_checkpoint import FullAC
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder

    FullAC.Config().build(dump_folder="").apply(lm.model)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("fsdp",))
    apply_fsdp_to_decoder(
        lm.model, mesh, param_dtype=torch.float32, reduce_dtype=torch.float32, pp_enabled=False
    )
    # TorchTitan turns FSDP's gradient division off (its loss divides by the global token
    # count), which reduces with PREMUL_SUM, an op gloo lacks; here the loss is each
    # rank's mean, so the gradients are summed and divided by the world size, as DDP does
    from torch.distributed.fsdp import FSDPModule

    for m in lm.model.modules():
        if isinstance(m, FSDPModule):
            m.set_force_sum_reduction_for_comms(True)
            m.set_gradient_divide_factor(float(dist.get_world_size()))
    return lm  # type: ignore[no-any-return]


def _is_titan(model: nn.Module) -> bool:
    from .titan import TitanLM

    return isinstance(model, TitanLM)


def _optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    # TorchTitan's flat optimizer state dict keys the state by parameter names
    params: Any = model.named_parameters() if _is_titan(model) else model.parameters()
    return torch.optim.AdamW(params, lr=lr, foreach=False)


def _titan_state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """TorchTitan's checkpoint layout: the model's own state_dict (its hooks split the
    fused QKV weight into wq / wk / wv, which torch's get_state_dict cannot resolve by
    attribute) and its flat, name-keyed optimizer state."""
    from torchtitan.components.optimizer.utils import get_flat_optim_state_dict, init_optim_state

    init_optim_state(opt)
    return {"model": model.state_dict(), "optim": get_flat_optim_state_dict(opt)}


def _train(
    call: nn.Module,
    params: nn.Module,
    opt: torch.optim.Optimizer,
    data: Any,
    seed: int,
    steps: range,
    save_at: int | None = None,
    save_to: Path | None = None,
) -> dict[str, Any]:
    rank, world = dist.get_rank(), dist.get_world_size()
    losses, nonfinite, in_sync = [], [], True
    sharded = call is params  # FSDP2 shards the module itself; DDP wraps it
    t0 = time.perf_counter()
    for step in steps:
        if step == save_at:
            _save(call, opt, save_to)
        opt.zero_grad(set_to_none=True)
        out = call(**_shard(data(seed, step), rank, world))
        loss = out.loss if hasattr(out, "loss") else out
        loss.backward()
        nonfinite.append(_nonfinite(params, sharded))
        opt.step()
        mean = loss.detach().float().clone()
        dist.all_reduce(mean)
        losses.append(float(mean) / world)
        digests = [torch.zeros(8, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(digests, _digest(params))
        in_sync &= all(torch.equal(d, digests[0]) for d in digests)
    seconds = (time.perf_counter() - t0) / max(1, len(steps))
    return {
        "losses": losses,
        "nonfinite_grads": nonfinite,
        "params_in_sync": in_sync,
        "seconds_per_step": seconds,
    }


def _save(model: nn.Module, opt: torch.optim.Optimizer, path: Path | None) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    assert path is not None
    inner = getattr(model, "module", model)  # DDP wraps it
    if _is_titan(inner):
        dcp.save(_titan_state(inner, opt), checkpoint_id=str(path))
        return
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(path))


def _load(model: nn.Module, opt: torch.optim.Optimizer, path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    inner = getattr(model, "module", model)
    if _is_titan(inner):
        from torchtitan.components.optimizer.utils import load_flat_optim_state_dict

        titan = _titan_state(inner, opt)
        dcp.load(titan, checkpoint_id=str(path))
        inner.load_state_dict(titan["model"])
        load_flat_optim_state_dict(opt, titan["optim"])
        return
    msd, osd = get_state_dict(model, opt)  # the layout to load into (initializes AdamW)
    state: dict[str, Any] = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])


def checkpoint_dir(out: Path, model: str, wrapper: str) -> Path:
    """Where the NKI run of `model` under `wrapper` saves its sharded checkpoint."""
    return out / "checkpoints" / f"{model.replace(':', '_')}-{wrapper}"


def main(argv: list[str] | None = None) -> int:
    """One rank of one phase (see module doc)."""
    p = argparse.ArgumentParser()
    p.add_argument("--phase", choices=("train", "resume"), required=True)
    p.add_argument("--model", action="append", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--tolerance", type=float, default=None)
    p.add_argument("--work", type=Path, required=True)
    a = p.parse_args(argv)
    dist.init_process_group("gloo")
    data, half = entry(a.data), a.steps // 2

    def say(line: str) -> None:
        if dist.get_rank() == 0:
            print(line, flush=True)

    result: dict[str, Any] = {}
    for spec in a.model:
        factory = entry(spec)
        runs: dict[str, Any] = {}
        for wrapper in WRAPPERS:
            ckpt = checkpoint_dir(a.work, spec, wrapper)
            if a.phase == "train":
                for path in PATHS:
                    say(f"[parity] {spec}: {wrapper} {path} run, {a.steps} steps")
                    call, params = _build(factory, a.seed, path == "nki", wrapper)
                    opt = _optimizer(params, a.lr)
                    save = half if path == "nki" else None
                    runs[f"{wrapper}/{path}"] = _train(
                        call, params, opt, data, a.seed, range(a.steps), save, ckpt
                    )
                    if wrapper == "ddp" and path == "reference":
                        tol, rule = tolerance_of(runs["ddp/reference"]["losses"][0], a.tolerance)
                        say(
                            f"[parity] {spec}: tolerance, fixed before the NKI runs: "
                            f"|Δloss| <= {tol:.3g} = {rule}"
                        )
            else:
                call, params = _build(factory, a.seed, True, wrapper)
                opt = _optimizer(params, a.lr)
                _load(call, opt, ckpt)
                runs[f"{wrapper}/resumed"] = _train(
                    call, params, opt, data, a.seed, range(half, a.steps)
                )
        result[spec] = runs
    if dist.get_rank() == 0:
        (a.work / f"{a.phase}.json").write_text(json.dumps(result, indent=1) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
