"""One rank of `nki-kernels parity --nproc N` (started by torchrun; see `distributed`).

Phase "train": for each model, under each wrapper (DistributedDataParallel, then FSDP2
`fully_shard`), the reference path and its noise floor's second torch implementation
(`alternative`, as in the single-process rule) train N steps; then the tolerance is fixed
from the floor (see `floor_tolerance`) and printed; then the NKI path trains N steps under
each wrapper (same seed, same data order, each rank on its rows `rank::N` of every
batch). After every step the full
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
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

WRAPPERS = ("ddp", "fsdp2")
FLOOR_PATHS = ("reference", "alternative")


def _max_gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def floor_tolerance(
    runs: dict[str, Any], single: list[float] | None, given: float | None, world: int
) -> dict[str, Any]:
    """The --nproc noise floor and the tolerance fixed from it, before any NKI run.

    The floor is the largest |Δloss| between two correct torch runs of the same training:
    under each wrapper, the reference against its second implementation
    (`<wrapper>/alternative`, the single-process rule's pair), and the reference at N
    processes against the same reference in one process on the whole batch (`single`:
    the same objective, with every reduction over the batch grouped differently; None
    when the ranks' shards are not the same objective, see `distributed`). Tolerance:
    the single-process rule, max(3 x floor, 16 fp32 ulps of the first loss), or the
    given value."""
    from .harness import tolerance_for

    parts: dict[str, float] = {}
    for w in WRAPPERS:
        ref = runs[f"{w}/reference"]["losses"]
        parts[f"{w}: reference vs alternative"] = _max_gap(ref, runs[f"{w}/alternative"]["losses"])
        if single is not None:
            parts[f"{w}: {world} processes vs 1"] = _max_gap(ref, single)
    floor = max(parts.values())
    tol, rule = tolerance_for(floor, runs["ddp/reference"]["losses"][0], torch.float32)
    if given is not None:
        tol, rule = float(given), "given (--tolerance)"
    return {"value": tol, "rule": rule, "floor": floor, "floor_parts": parts}


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


def _build(factory: Any, seed: int, path: str, wrapper: str) -> tuple[nn.Module, nn.Module]:
    """(the module to call, the module holding the parameters) for one run; `path` is
    "reference", "alternative" (the noise floor's second torch implementation) or "nki"."""
    import nki_kernels

    from .harness import _alternative_impl

    alternative = path == "alternative"
    if getattr(factory, "builds_nki", False):
        if alternative:
            model = factory(seed=seed, nki=False, alternative=True)
        else:
            model = factory(seed=seed, nki=path == "nki")
    else:
        model = factory(seed=seed)
        if path == "nki":
            nki_kernels.patch(model)
    model.train()
    if getattr(factory, "titan_name", None) and wrapper == "fsdp2":
        return _titan_fsdp(model), model
    # the plain factories' second implementation wraps the model (SDPA math backend)
    call = _alternative_impl(model) if alternative and not factory_builds(factory) else model
    if wrapper == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(call), model
    from torch.distributed.fsdp import fully_shard

    layers = getattr(getattr(model, "model", None), "layers", None)
    for layer in layers if isinstance(layers, nn.ModuleList) else ():
        fully_shard(layer)  # one all-gather / reduce-scatter group per decoder layer
    fully_shard(model)
    return call, model


def factory_builds(factory: Any) -> bool:
    """Whether the factory builds both paths itself (TorchTitan, kernels: models)."""
    return bool(getattr(factory, "builds_nki", False))


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
    opt = torch.optim.AdamW(params, lr=lr, foreach=False)
    if _is_titan(model):
        model.attach_optimizer(opt)  # type: ignore[operator]
    return opt


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
    sharded: bool = False,
) -> dict[str, Any]:
    rank, world = dist.get_rank(), dist.get_world_size()
    losses, nonfinite, in_sync = [], [], True
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
    p.add_argument("--single", type=Path, default=None, help="one-process reference losses")
    a = p.parse_args(argv)
    dist.init_process_group("gloo")
    data, half = entry(a.data), a.steps // 2

    def say(line: str) -> None:
        if dist.get_rank() == 0:
            print(line, flush=True)

    single = json.loads(a.single.read_text()) if a.single else {}
    result: dict[str, Any] = {}
    for spec in a.model:
        factory = entry(spec)
        runs: dict[str, Any] = {}
        if a.phase == "train":
            paths = [(w, p) for w in WRAPPERS for p in FLOOR_PATHS]
            for wrapper, path in paths + [(w, "nki") for w in WRAPPERS]:
                if path == "nki" and "tolerance" not in runs:
                    runs["tolerance"] = t = floor_tolerance(
                        runs, single.get(spec), a.tolerance, dist.get_world_size()
                    )
                    say(
                        f"[parity] {spec}: tolerance, fixed before the NKI runs: "
                        f"|Δloss| <= {t['value']:.3g} = {t['rule']}; floor parts "
                        + ", ".join(f"{k} {v:.3g}" for k, v in t["floor_parts"].items())
                    )
                say(f"[parity] {spec}: {wrapper} {path} run, {a.steps} steps")
                call, params = _build(factory, a.seed, path, wrapper)
                opt = _optimizer(params, a.lr)
                save = half if path == "nki" else None
                ckpt = checkpoint_dir(a.work, spec, wrapper)
                runs[f"{wrapper}/{path}"] = _train(
                    call, params, opt, data, a.seed, range(a.steps), save, ckpt, wrapper == "fsdp2"
                )
        else:
            for wrapper in WRAPPERS:
                call, params = _build(factory, a.seed, "nki", wrapper)
                opt = _optimizer(params, a.lr)
                _load(call, opt, checkpoint_dir(a.work, spec, wrapper))
                runs[f"{wrapper}/resumed"] = _train(
                    call,
                    params,
                    opt,
                    data,
                    a.seed,
                    range(half, a.steps),
                    sharded=wrapper == "fsdp2",
                )
        result[spec] = runs
    if dist.get_rank() == 0:
        (a.work / f"{a.phase}.json").write_text(json.dumps(result, indent=1) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # the phase's results are written and the process group destroyed; skipping the
    # interpreter's teardown avoids aborts (std::terminate) from c10d / gloo threads that
    # are still joinable when their owners are destroyed at exit
    os._exit(code)
