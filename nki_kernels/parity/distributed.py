"""`nki-kernels parity --nproc N`: the golden-batch check at the smallest distributed scale.

`launch()` runs two torchrun (`torch.distributed.run`) launches of N CPU processes each,
gloo backend, every model in the same launch (`dist_rank` is the rank side):

1. **train**: under DistributedDataParallel and under FSDP2 (`fully_shard`, one group
   per decoder layer), the reference path and the NKI path (`nki_kernels.patch`) train N
   steps each on the same batches, each rank on its rows; the full parameters are
   compared across ranks after every step; the NKI run saves a sharded checkpoint
   (torch.distributed.checkpoint) before step N // 2;
2. **resume**: fresh processes build fresh patched models, load each checkpoint (model
   and optimizer state dicts through `set_state_dict`) and run steps N // 2 .. N-1.

The report per model and wrapper: per-step mean loss over ranks for both paths, their
deltas against the tolerance, the first divergent step, non-finite gradient elements
per step, whether the parameters stayed identical on all ranks, the resumed run's max
|Δloss| against the uninterrupted NKI run, and FSDP2 against DDP on the same path (the
two reduce gradients differently, so this shows FSDP2's reduce-scatter gives DDP's
all-reduce result).

The tolerance is fixed first, from a noise floor measured in this mode (`dist_rank.
floor_tolerance`): before the launches, the reference trains N steps in this process on
the whole batch (one process: the same objective as the ranks' mean loss when every rank
holds as many loss positions, checked by `same_objective`; otherwise that term is left
out and the rule says so); in the train launch, under each wrapper, the reference and its
second torch implementation (the single-process rule's pair) train before any NKI run.
The floor is the largest |Δloss| of those pairs, the tolerance max(3 x floor, 16 fp32
ulps of the first loss), printed before the NKI runs.

Each rank's output goes to `<out>/logs/<phase>/`; when a launch fails, the error quotes
the failing ranks' last lines (torchrun itself reports only an exit code).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from .dist_rank import WRAPPERS, entry, factory_builds
from .report import loss_figure, save_figure

IGNORE_INDEX = -100  # the loss positions' mark, as in torch's cross_entropy


def same_objective(data: Any, seed: int, steps: int, world: int) -> str | None:
    """None when the mean over `world` ranks of each rank's mean loss is the one-process
    mean loss for every step's batch; otherwise why not. With `labels`, every rank must
    hold as many loss positions (labels != -100, before and after the one-position shift
    of a causal-LM loss); without, as many rows."""
    for step in range(steps):
        batch = data(seed, step)
        labels = batch.get("labels")
        if labels is None:
            rows = {
                len(v[r::world])
                for v in batch.values()
                if hasattr(v, "shape")
                for r in range(world)
            }
            if len(rows) > 1:
                return f"step {step}: the ranks hold different numbers of rows"
            continue
        for shifted in (labels, labels[:, 1:]):
            counts = {int((shifted[r::world] != IGNORE_INDEX).sum()) for r in range(world)}
            if len(counts) > 1:
                return f"step {step}: the ranks hold different numbers of loss positions"
    return None


def single_process(
    models: list[str], data: str, steps: int, seed: int, lr: float, world: int
) -> dict[str, Any]:
    """Per model, the reference's losses trained in this process on the whole batch (the
    --nproc floor's one-process run), or the reason it is not the same objective."""
    from .harness import _train

    batches = entry(data)
    out: dict[str, Any] = {}
    for spec in models:
        why = same_objective(batches, seed, steps, world)
        if why is not None:
            out[spec] = {"losses": None, "why_not": why}
            continue
        factory = entry(spec)
        model = factory(seed=seed, nki=False) if factory_builds(factory) else factory(seed=seed)
        print(
            f"[parity] {spec}: one-process reference run (noise floor), {steps} steps", flush=True
        )
        run, _ = _train("single", model, batches, seed, range(steps), "cpu", lr)
        out[spec] = {"losses": run.losses, "seconds_per_step": run.seconds / steps}
    return out


def _torchrun(nproc: int, phase: str, work: Path, args: list[str]) -> dict[str, Any]:
    """Launch one phase; a failed launch is relaunched once (both phases are deterministic:
    same seed, data and checkpoint), its log tails printed, and a second failure raises."""
    failures = []
    for attempt in range(2):
        logs = work / "logs" / phase / f"launch-{attempt}"
        proc = subprocess.run(
            _torchrun_cmd(nproc, phase, work, args, logs), stderr=subprocess.PIPE, text=True
        )
        if proc.returncode == 0:
            return json.loads((work / f"{phase}.json").read_text())  # type: ignore[no-any-return]
        tails = [
            f"--- {f.relative_to(logs)}:\n" + "\n".join(f.read_text().splitlines()[-25:])
            for f in sorted(logs.rglob("std*.log"))
            if f.stat().st_size
        ]
        failures.append(
            f"the {phase} launch failed (exit {proc.returncode})\n"
            + "\n".join(tails or [proc.stderr[-4000:]])
        )
        if attempt == 0:
            print(
                f"[parity] {failures[0]}\n[parity] relaunching the {phase} phase once", flush=True
            )
    raise RuntimeError(f"parity --nproc {nproc}: " + "\n".join(failures))


def _torchrun_cmd(nproc: int, phase: str, work: Path, args: list[str], logs: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        f"--log-dir={logs}",
        "--redirects=3",
        "--tee=1",  # rank 0's progress lines (the tolerance first) reach the console too
        "-m",
        "nki_kernels.parity.dist_rank",
        "--phase",
        phase,
        "--work",
        str(work),
        *args,
    ]


def _first_divergent(a: list[float], b: list[float], tol: float) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if not abs(x - y) <= tol), None)


def _max_delta(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def merge(
    model: str,
    world: int,
    steps: int,
    train: dict[str, Any],
    resume: dict[str, Any],
) -> dict[str, Any]:
    """One model's report from the two phases' results (the tolerance as the train
    launch fixed and printed it before the NKI runs)."""
    fixed = train["tolerance"]
    tol, half = fixed["value"], steps // 2
    out: dict[str, Any] = {
        "model": model,
        "world_size": world,
        "backend": "gloo (CPU)",
        "steps": steps,
        "floor": fixed["floor"],
        "floor_parts": fixed["floor_parts"],
        "tolerance": tol,
        "tolerance_rule": fixed["rule"],
        "resume_from": half,
        "single_process": train.get("single_process"),
    }
    passed = True
    for w in WRAPPERS:
        ref, cand = train[f"{w}/reference"], train[f"{w}/nki"]
        resumed = resume[f"{w}/resumed"]
        deltas = [abs(x - y) for x, y in zip(cand["losses"], ref["losses"], strict=True)]
        first = _first_divergent(cand["losses"], ref["losses"], tol)
        resume_delta = _max_delta(resumed["losses"], cand["losses"][half:])
        sync = {"reference": ref["params_in_sync"], "candidate": cand["params_in_sync"]}
        sync["resumed"] = resumed["params_in_sync"]
        new_nonfinite = any(
            c > 0 and r == 0
            for c, r in zip(cand["nonfinite_grads"], ref["nonfinite_grads"], strict=True)
        )
        ok = first is None and all(sync.values()) and resume_delta <= tol and not new_nonfinite
        out[w] = {
            "wrapper": "DistributedDataParallel" if w == "ddp" else "FSDP2 (fully_shard)",
            "reference_losses": ref["losses"],
            "alternative_losses": train[f"{w}/alternative"]["losses"],
            "candidate_losses": cand["losses"],
            "resumed_losses": resumed["losses"],
            "deltas": deltas,
            "max_delta": max(deltas),
            "first_divergent_step": first,
            "params_in_sync": sync,
            "nonfinite_grads": {
                "reference": ref["nonfinite_grads"],
                "candidate": cand["nonfinite_grads"],
            },
            "resume_max_delta": resume_delta,
            "seconds_per_step": {
                "reference": ref["seconds_per_step"],
                "alternative": train[f"{w}/alternative"]["seconds_per_step"],
                "candidate": cand["seconds_per_step"],
            },
            "passed": ok,
        }
        passed &= ok
    fsdp_vs_ddp = {
        p: _max_delta(train[f"fsdp2/{p}"]["losses"], train[f"ddp/{p}"]["losses"])
        for p in ("reference", "nki")
    }
    out["fsdp2_vs_ddp_max_delta"] = fsdp_vs_ddp
    out["passed"] = passed and max(fsdp_vs_ddp.values()) <= tol
    return out


def report_path(out: Path, model: str, nproc: int) -> Path:
    """Where `launch` writes a model's report."""
    return out / f"{model.replace(':', '_')}-dist{nproc}.json"


def launch(
    nproc: int,
    models: list[str],
    data: str,
    steps: int,
    seed: int,
    lr: float,
    tolerance: float | None,
    out: Path,
) -> dict[str, dict[str, Any]]:
    """Both phases on `nproc` CPU processes; writes and returns each model's report."""
    if steps < 2:
        raise ValueError(
            f"steps: expected >= 2 (a resume point needs a step before it); got {steps}"
        )
    out.mkdir(parents=True, exist_ok=True)
    single = single_process(models, data, steps, seed, lr, nproc)
    single_path = out / "single.json"
    single_path.write_text(json.dumps({m: s["losses"] for m, s in single.items()}) + "\n")
    args = ["--data", data, "--steps", str(steps), "--seed", str(seed), "--lr", str(lr)]
    args += ["--single", str(single_path)]
    if tolerance is not None:
        args += ["--tolerance", str(tolerance)]
    for m in models:
        args += ["--model", m]
    train = _torchrun(nproc, "train", out, args)
    resume = _torchrun(nproc, "resume", out, args)
    reports = {}
    for m in models:
        train[m]["single_process"] = single[m]
        r = merge(m, nproc, steps, train[m], resume[m])
        report_path(out, m, nproc).write_text(json.dumps(r, indent=1) + "\n")
        reports[m] = r
    return reports


def summary(r: dict[str, Any]) -> list[str]:
    """The verdict lines of one model's distributed report."""
    lines = [
        f"[parity] {r['model']}: {r['world_size']} ranks, {r['backend']}; tolerance "
        f"{r['tolerance']:.3g} ({r['tolerance_rule']}), fixed before the NKI runs; floor "
        + ", ".join(f"{k} {v:.3g}" for k, v in r["floor_parts"].items())
    ]
    single = r.get("single_process") or {}
    if single.get("why_not"):
        lines.append(f"[parity]   no one-process floor run: {single['why_not']}")
    for w in WRAPPERS:
        x = r[w]
        first = x["first_divergent_step"]
        lines.append(
            f"[parity]   {x['wrapper']}: max |Δloss| {x['max_delta']:.3g}, first divergent "
            f"step {'none' if first is None else first}, parameters identical on all ranks "
            f"after every step {x['params_in_sync']}, non-finite gradient elements "
            f"{sum(x['nonfinite_grads']['candidate'])} (reference "
            f"{sum(x['nonfinite_grads']['reference'])}), sharded checkpoint at step "
            f"{r['resume_from']} -> fresh processes -> continue: max |Δloss| "
            f"{x['resume_max_delta']:.3g}; {'PASS' if x['passed'] else 'FAIL'}"
        )
    d = r["fsdp2_vs_ddp_max_delta"]
    lines.append(
        f"[parity]   FSDP2 vs DDP, same path: max |Δloss| reference {d['reference']:.3g}, "
        f"NKI {d['nki']:.3g}; verdict {'PASS' if r['passed'] else 'FAIL'}"
    )
    return lines


def plot(reports: list[dict[str, Any]], path: Path) -> Path | None:
    """Per model: loss curves (reference, NKI under DDP and FSDP2, the resumed run) and
    |Δloss| per wrapper against the tolerance; None when matplotlib is not installed."""
    figure = loss_figure(len(reports))
    if figure is None:
        return None
    plt, fig, axes = figure
    for col, r in enumerate(reports):
        top, bottom = axes[0][col], axes[1][col]
        steps, half = list(range(r["steps"])), r["resume_from"]
        top.plot(steps, r["ddp"]["reference_losses"], label="reference (torch), DDP", lw=2)
        for w, style in (("ddp", "--"), ("fsdp2", ":")):
            x = r[w]
            top.plot(steps, x["candidate_losses"], style, label=f"NKI, {x['wrapper']}", lw=2)
            top.plot(steps[half:], x["resumed_losses"], "x", label=f"resumed, {w}")
            deltas = [max(d, 1e-12) for d in x["deltas"]]
            bottom.semilogy(steps, deltas, "o" + style, label=f"|Δloss| {w} (0 drawn at 1e-12)")
        top.set_title(f"{r['model']}, {r['world_size']} ranks (fp32)")
        top.set_ylabel("training loss (mean over ranks)")
        top.legend(fontsize=7)
        bottom.axhline(r["tolerance"], color="red", lw=1, label=f"tolerance {r['tolerance']:.2g}")
        bottom.axvline(half, color="grey", lw=1, label=f"checkpoint (step {half})")
        bottom.set_xlabel("step")
        bottom.legend(fontsize=7)
    return save_figure(plt, fig, path)


__all__ = ["launch", "merge", "plot", "report_path", "summary"]
