"""The golden-batch harness: train the same model twice on the same batches, on the
reference path and on the NKI path, and compare the two trajectories step by step.

    model_factory(seed, dtype) -> nn.Module      a fresh model, same weights for a seed
    data_factory(seed, step)   -> dict           the forward's keyword arguments for a step
                                                 (the same batches in the same order)

The runs, in order:

1. **noise floor**: the reference twice, with two correct torch implementations of the
   same semantics: torch's SDPA on its default CPU kernel vs its math backend and, for
   transformers MoE models, experts "grouped_mm" vs "batched_mm" (a factory with
   `builds_nki = True`, as for TorchTitan models, builds both paths itself:
   `factory(seed=, dtype=, nki=, alternative=)`). The largest |Δloss|
   between them is the noise floor of this dtype, model and data. (transformers' "eager"
   attention is not used: it gives fully masked padding rows uniform attention where
   SDPA gives zeros, a difference of semantics, not of rounding, that reaches the loss.)
2. **tolerance**: fixed from the floor *before* the NKI run, and printed:
   `tol = max(FLOOR_MARGIN x floor, ULPS x eps(float32) x |loss at step 0|)` (the loss
   is an fp32 reduction in every dtype);
3. **candidate**: the NKI path (`nki_kernels.patch`; or, with `device="neuron"`, the
   patched model on the neuron device against the patched model on CPU), N steps, with
   a checkpoint (model + optimizer state) saved at step N // 2;
4. **resume**: a fresh model loads that checkpoint and runs steps N // 2 .. N-1 again;
   its losses must match the uninterrupted candidate's.

Every step records the loss, the gradient norm and the count of non-finite gradient
elements. The first divergent step is the first with |Δloss| > tol.

Reproducible: every run trains with torch on one thread and torch's deterministic
algorithms on (the interpreter already runs NumPy's BLAS on one thread), so a rerun on
the same versions gives the same losses, floor, tolerance and deltas bit for bit, on any
core count. The report records the versions, the thread count and, for its measured
seconds, the date, the machine and its load.
"""

from __future__ import annotations

import datetime
import io
import math
import os
import platform
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

FLOOR_MARGIN = 3.0
ULPS = 16
TORCH_THREADS = 1  # a reduction's order, hence a bf16 loss, depends on torch's thread count

ModelFactory = Callable[..., nn.Module]
DataFactory = Callable[[int, int], dict[str, Any]]


@dataclass
class Run:
    """One training run: per-step loss, gradient norm and non-finite gradient count."""

    name: str
    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    nonfinite: list[int] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class Report:
    """The harness's result (also written as JSON)."""

    model: str
    dtype: str
    steps: int
    seed: int
    mode: str
    floor: float
    tolerance: float
    tolerance_rule: str
    reference: Run
    alternative: Run
    candidate: Run
    resumed: Run
    resume_from: int
    first_divergent_step: int | None
    resume_max_delta: float
    patched: dict[str, int] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)

    @property
    def deltas(self) -> list[float]:
        """|loss_candidate - loss_reference| per step."""
        return [abs(a - b) for a, b in zip(self.candidate.losses, self.reference.losses)]

    @property
    def passed(self) -> bool:
        """No divergent step, no new non-finite gradients, and the resume matches."""
        new_nonfinite = any(
            c > 0 and r == 0 for c, r in zip(self.candidate.nonfinite, self.reference.nonfinite)
        )
        return (
            self.first_divergent_step is None
            and not new_nonfinite
            and self.resume_max_delta <= self.tolerance
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (with the per-step deltas and the verdict)."""
        out = asdict(self)
        out["deltas"] = self.deltas
        out["passed"] = self.passed
        return out


def _loss(out: Any) -> torch.Tensor:
    loss = out.loss if hasattr(out, "loss") else out
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise TypeError(
            "model: expected the forward to return a scalar loss or an output with .loss; "
            f"got {type(loss).__name__}"
        )
    return loss


def _to(batch: dict[str, Any], device: str) -> dict[str, Any]:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _step(model: nn.Module, opt: torch.optim.Optimizer, batch: dict[str, Any], run: Run) -> None:
    opt.zero_grad(set_to_none=True)
    loss = _loss(model(**batch))
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    nonfinite = sum(int((~torch.isfinite(g)).sum()) for g in grads)
    norm = math.sqrt(sum(float(g.detach().float().pow(2).sum().cpu()) for g in grads))
    opt.step()
    run.losses.append(float(loss.detach().float().cpu()))
    run.grad_norms.append(norm)
    run.nonfinite.append(nonfinite)


def _optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    opt = torch.optim.AdamW(model.parameters(), lr=lr, foreach=False)
    attach = getattr(model, "attach_optimizer", None)  # a framework's optimizer hooks
    if attach is not None:
        attach(opt)
    return opt


def _train(
    name: str,
    model: nn.Module,
    data: DataFactory,
    seed: int,
    steps: range,
    device: str,
    lr: float,
    opt: torch.optim.Optimizer | None = None,
    checkpoint_at: int | None = None,
) -> tuple[Run, bytes | None]:
    model.train()
    opt = opt or _optimizer(model, lr)
    run, saved = Run(name), None
    t0 = time.perf_counter()
    for step in steps:
        if step == checkpoint_at:
            buf = io.BytesIO()
            torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, buf)
            saved = buf.getvalue()
        _step(model, opt, _to(data(seed, step), device), run)
    run.seconds = time.perf_counter() - t0
    return run, saved


class _MathSdpa(nn.Module):
    """`model` with torch's SDPA pinned to its math backend (the noise-floor run)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, **batch: Any) -> Any:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.MATH]):
            return self.model(**batch)


def _alternative_impl(model: nn.Module) -> nn.Module:
    """The same model on a second correct torch implementation (see module doc)."""
    config = getattr(model, "config", None)
    if getattr(config, "_experts_implementation", None) and hasattr(
        model, "set_experts_implementation"
    ):
        model.set_experts_implementation("batched_mm")  # type: ignore[operator]
    return _MathSdpa(model)


@contextmanager
def reproducible() -> Iterator[None]:
    """torch on TORCH_THREADS threads with deterministic algorithms, restored after."""
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.set_num_threads(TORCH_THREADS)
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)


def environment() -> dict[str, Any]:
    """What a rerun must match to give the same numbers (versions, threads), and what the
    measured seconds ran on (date, machine, its 1-minute load average at the start)."""
    import numpy

    try:
        import transformers

        hf = transformers.__version__
    except ImportError:
        hf = None
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {
        "torch": torch.__version__,
        "transformers": hf,
        "numpy": numpy.__version__,
        "torch_threads": TORCH_THREADS,
        "deterministic_algorithms": True,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} CPU cores, {platform.machine()}, {platform.system()}",
        "load_average_1min": None if load is None else round(load, 2),
    }


def tolerance_for(floor: float, loss0: float, dtype: torch.dtype) -> tuple[float, str]:
    """The fixed tolerance on |Δloss| and the rule that produced it, as printed."""
    del dtype  # the floor carries the dtype; the loss itself is an fp32 reduction
    ulp_term = ULPS * torch.finfo(torch.float32).eps * abs(loss0)
    tol = max(FLOOR_MARGIN * floor, ulp_term)
    rule = (
        f"max({FLOOR_MARGIN:g} x noise floor {floor:.3g}, {ULPS} x eps(float32) x "
        f"|loss0| = {ulp_term:.3g})"
    )
    return tol, rule


def run_parity(
    model_factory: ModelFactory,
    data_factory: DataFactory,
    *,
    name: str = "model",
    steps: int = 20,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    lr: float = 1e-3,
    device: str | None = None,
    tolerance: float | None = None,
    log: Callable[[str], None] = print,
) -> Report:
    """Run the golden-batch check (see module doc); `device="neuron"` compares the patched
    model on the neuron device against the patched model on CPU."""
    env = environment()
    with reproducible():
        report = _run(
            model_factory, data_factory, name, steps, seed, dtype, lr, device, tolerance, log
        )
    report.environment = env
    return report


def _run(
    model_factory: ModelFactory,
    data_factory: DataFactory,
    name: str,
    steps: int,
    seed: int,
    dtype: torch.dtype,
    lr: float,
    device: str | None,
    tolerance: float | None,
    log: Callable[[str], None],
) -> Report:
    import nki_kernels

    if steps < 2:
        raise ValueError(
            f"steps: expected >= 2 (a resume point needs a step before it); got {steps}"
        )
    mode = "cpu vs neuron (both NKI)" if device else "reference ops vs NKI ops"

    builds_nki = getattr(model_factory, "builds_nki", False)  # TorchTitan / kernels models

    def fresh(patched: bool) -> nn.Module:
        if builds_nki:
            return model_factory(seed=seed, dtype=dtype, nki=patched)
        m = model_factory(seed=seed, dtype=dtype)
        if patched:
            nki_kernels.patch(m)
        return m

    all_steps = range(steps)
    torch_ref, _ = _train("reference", fresh(False), data_factory, seed, all_steps, "cpu", lr)
    if builds_nki:
        alt_model = model_factory(seed=seed, dtype=dtype, nki=False, alternative=True)
    else:
        alt_model = _alternative_impl(fresh(patched=False))
    alt, _ = _train("alternative", alt_model, data_factory, seed, all_steps, "cpu", lr)
    floor = max(abs(a - b) for a, b in zip(torch_ref.losses, alt.losses))
    tol, rule = tolerance_for(floor, torch_ref.losses[0], dtype)
    if tolerance is not None:
        tol, rule = float(tolerance), "given (--tolerance)"
    log(f"[parity] {name} {str(dtype)[6:]}, {steps} steps, seed {seed}: {mode}")
    log(f"[parity] tolerance, fixed before the run: |Δloss| <= {tol:.3g} = {rule}")
    ref = torch_ref
    if device is not None:  # the CPU side of a device comparison runs the NKI ops too
        ref, _ = _train("reference", fresh(True), data_factory, seed, all_steps, "cpu", lr)

    cand_model = fresh(patched=True)
    patched = {}
    state = getattr(cand_model, "_nki_patch", None)
    if state is not None:
        patched = {"modules": len(state[0])}
    elif isinstance(getattr(cand_model, "nki_replaced", None), dict):
        patched = dict(cand_model.nki_replaced)  # type: ignore[arg-type]
    target = device or "cpu"
    half = steps // 2
    cand, saved = _train(
        "candidate",
        cand_model.to(target),
        data_factory,
        seed,
        all_steps,
        target,
        lr,
        checkpoint_at=half,
    )
    assert saved is not None
    resumed_model = fresh(patched=True).to(target)
    # to host first: load_state_dict then copies into the device tensors
    ckpt = torch.load(io.BytesIO(saved), map_location="cpu", weights_only=True)
    resumed_model.load_state_dict(ckpt["model"])
    opt = _optimizer(resumed_model, lr)
    opt.load_state_dict(ckpt["optim"])
    resumed, _ = _train(
        "resumed", resumed_model, data_factory, seed, range(half, steps), target, lr, opt=opt
    )
    resume_delta = max(abs(a - b) for a, b in zip(resumed.losses, cand.losses[half:]))
    first = next(
        (i for i, (a, b) in enumerate(zip(cand.losses, ref.losses)) if not abs(a - b) <= tol),
        None,
    )
    return Report(
        model=name,
        dtype=str(dtype).removeprefix("torch."),
        steps=steps,
        seed=seed,
        mode=mode,
        floor=floor,
        tolerance=tol,
        tolerance_rule=rule,
        reference=ref,
        alternative=alt,
        candidate=cand,
        resumed=resumed,
        resume_from=half,
        first_divergent_step=first,
        resume_max_delta=resume_delta,
        patched=patched,
    )


__all__ = [
    "DataFactory",
    "ModelFactory",
    "Report",
    "Run",
    "environment",
    "reproducible",
    "run_parity",
    "tolerance_for",
]
