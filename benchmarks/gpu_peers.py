"""Measure the cost ledger's GPU rows on any CUDA machine, at the ledger's own shapes.

    python benchmarks/gpu_peers.py --model llama3-8b --phase train --seq 8192 --out rows.jsonl
    python benchmarks/gpu_peers.py --model mixtral-8x7b --phase decode --batch 64 --context 32768

For every op of one layer of the step (and the head) that `nki_kernels.ledger.layers`
lists, the plain PyTorch a GPU user runs is timed: `torch.matmul` for each GEMM (forward,
dX and dW are each a GEMM of their own shape), `F.scaled_dot_product_attention` (causal,
GQA via `enable_gqa`; forward, and backward as median(fwd + bwd) - median(fwd)), SDPA at
Sq = 1 over the cache for decode, DeepSeek's MLA (SDPA with q / k 192 and v 128 wide; at
decode the absorbed form, einsum + softmax over the shared latent cache), `F.rms_norm`
eager and under `torch.compile`, the SwiGLU product, and a dropless MoE on
`torch._grouped_mm` (uniform routing). Timing: CUDA events, `--warmup` calls, then the
median of `--reps` (range kept); the device name, torch, CUDA and the date go into every
row. The rows are in the format `nki_kernels.ledger.gpu.GpuRows` reads (that of
`benchmarks/data/gpu_rows.jsonl`); append them there (or pass `--gpu-rows` to
`nki-kernels ledger`).

Without CUDA the script stops with `CudaUnavailable` (exit status 2) before timing
anything; it imports on any machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

METHOD = (
    "CUDA events, median of {reps} after {warmup} warm-up calls; "
    "bwd = median(fwd + bwd) - median(fwd)"
)


class CudaUnavailable(RuntimeError):
    """No CUDA device: the GPU rows cannot be measured on this machine."""


def require_cuda() -> Any:
    """torch, once a CUDA device is known to be there (else CudaUnavailable)."""
    try:
        import torch
    except ImportError as exc:
        raise CudaUnavailable(f"torch is not installed ({exc})") from None
    if not torch.cuda.is_available():
        raise CudaUnavailable(
            "torch.cuda.is_available() is False: run gpu_peers.py on a machine with an "
            f"NVIDIA GPU and a CUDA build of torch (this torch is {torch.__version__})"
        )
    return torch


def time_us(
    torch: Any, fn: Callable[[], Any], warmup: int, reps: int
) -> tuple[float, float, float]:
    """(median, min, max) microseconds of `fn` over `reps` CUDA-event timings."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times), min(times), max(times)


def ledger_ops(model_name: str, phase: str, batch: int, seq: int, context: int) -> list[Any]:
    """The ledger's ops of one step (every layer kind once, and the head)."""
    from nki_kernels.ledger.layers import Step, head_ops, layer_kinds, layer_ops
    from nki_kernels.ledger.models import get_model

    model = get_model(model_name)
    step = Step(phase, batch, seq=seq, context=context)
    ops = []
    for _, _, moe in layer_kinds(model):
        ops += layer_ops(model, step, moe)
    return [model, *ops, *head_ops(model, step)]


def absorbed_mla_decode(torch: Any, q: Any, cache: Any, lat: int) -> Any:
    """[B, H, lat] outputs of absorbed MLA: q [B, H, lat + rope] (the query with `kv_b`'s
    key half folded in) against cache [B, L, lat + rope] (latent + rotary key); the
    values are the cache's latent part, shared by every head."""
    scores = torch.einsum("bhd,bld->bhl", q, cache) / (q.shape[-1] ** 0.5)
    p = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return torch.einsum("bhl,bld->bhd", p, cache[..., :lat])


def make_row(
    base: dict[str, Any],
    family: str,
    op: str,
    case: str,
    fwd: tuple[float, float, float],
    **kw: Any,
) -> dict[str, Any]:
    """One row in the ledger's GPU format: `base` (device, torch, cuda, date, method,
    provenance), what was timed, and (median, min, max) microseconds."""
    return {
        **base,
        "family": family,
        "op": op,
        "case": case,
        "latency_us": fwd[0],
        "range_us": [fwd[1], fwd[2]],
        **kw,
    }


class Measurer:
    """Times each op kind and returns rows in the ledger's GPU format."""

    def __init__(self, torch: Any, warmup: int, reps: int) -> None:
        self.t, self.warmup, self.reps = torch, warmup, reps
        self.dev = torch.device("cuda")
        self.base = {
            "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "date": datetime.now(UTC).date().isoformat(),
            "method": METHOD.format(reps=reps, warmup=warmup),
            "provenance": f"measured ({torch.cuda.get_device_name(0)})",
        }

    def _row(
        self, family: str, op: str, case: str, fwd: tuple[float, float, float], **kw: Any
    ) -> dict[str, Any]:
        return make_row(self.base, family, op, case, fwd, **kw)

    def _time(self, fn: Callable[[], Any]) -> tuple[float, float, float]:
        return time_us(self.t, fn, self.warmup, self.reps)

    def _rand(self, *shape: int, grad: bool = False) -> Any:
        x = self.t.randn(*shape, device=self.dev, dtype=self.t.bfloat16)
        return x.requires_grad_(grad)

    def gemm(self, m: int, k: int, n: int) -> dict[str, Any]:
        a, b = self._rand(m, k), self._rand(k, n)
        fwd = self._time(lambda: a @ b)
        return self._row(
            "gemm", "matmul", f"[{m}, {k}] x [{k}, {n}] bf16", fwd, tflops=2e-6 * m * k * n / fwd[0]
        )

    def attention(
        self, kind: str, seq: int, batch: int, heads: int, kv: int, d: int
    ) -> list[dict[str, Any]]:
        F = self.t.nn.functional
        q = self._rand(batch, heads, seq, d, grad=True)
        k, v = self._rand(batch, kv, seq, d, grad=True), self._rand(batch, kv, seq, d, grad=True)

        def fwd() -> Any:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv != heads)

        def both() -> None:
            fwd().sum().backward()

        case = f"B={batch} H={heads}/{kv} S={seq} D={d} bf16"
        f = self._time(fwd)
        if kind == "fwd":
            return [self._row("attention", "sdpa fwd causal", case, f, backend="default")]
        fb = self._time(both)
        bwd = (fb[0] - f[0], fb[1] - f[0], fb[2] - f[0])
        return [
            self._row(
                "attention", "sdpa bwd causal", case, bwd, backend="default", fwd_plus_bwd_us=fb[0]
            )
        ]

    def decode(self, batch: int, ctx: int, heads: int, kv: int, d: int) -> dict[str, Any]:
        F = self.t.nn.functional
        q = self._rand(batch, heads, 1, d)
        k, v = self._rand(batch, kv, ctx, d), self._rand(batch, kv, ctx, d)
        f = self._time(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=kv != heads))
        kv_bytes = 2.0 * batch * kv * ctx * d * 2
        case = f"B={batch} Hq={heads} Hkv={kv} L={ctx} D={d} bf16"
        return self._row("decode", "sdpa decode (1 query)", case, f, hbm_GBps=kv_bytes / f[0] / 1e3)

    def mla_attention(
        self, kind: str, seq: int, batch: int, heads: int, d_qk: int, d_v: int
    ) -> list[dict[str, Any]]:
        """DeepSeek's expanded MLA: SDPA with q / k of `d_qk` and v of `d_v` per head."""
        F = self.t.nn.functional
        q, k = (
            self._rand(batch, heads, seq, d_qk, grad=True),
            self._rand(batch, heads, seq, d_qk, grad=True),
        )
        v = self._rand(batch, heads, seq, d_v, grad=True)

        def fwd() -> Any:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        case = f"B={batch} H={heads} S={seq} D_qk={d_qk} D_v={d_v} bf16"
        f = self._time(fwd)
        if kind == "fwd":
            return [self._row("attention", "sdpa mla fwd causal", case, f, backend="default")]
        fb = self._time(lambda: fwd().sum().backward())
        bwd = (fb[0] - f[0], fb[1] - f[0], fb[2] - f[0])
        return [
            self._row(
                "attention",
                "sdpa mla bwd causal",
                case,
                bwd,
                backend="default",
                fwd_plus_bwd_us=fb[0],
            )
        ]

    def mla_decode(self, batch: int, ctx: int, heads: int, lat: int, rope: int) -> dict[str, Any]:
        """Absorbed MLA decode: every head's latent query against the shared latent cache."""
        q = self._rand(batch, heads, lat + rope)
        cache = self._rand(batch, ctx, lat + rope)
        f = self._time(lambda: absorbed_mla_decode(self.t, q, cache, lat))
        cache_bytes = 2.0 * batch * ctx * (lat + rope)
        case = f"B={batch} H={heads} L={ctx} latent={lat}+{rope} bf16"
        return self._row(
            "decode",
            "mla decode (absorbed)",
            case,
            f,
            backend="torch einsum + softmax",
            hbm_GBps=cache_bytes / f[0] / 1e3,
        )

    def norm(self, kind: str, t: int, h: int) -> list[dict[str, Any]]:
        F = self.t.nn.functional
        x, w = self._rand(t, h, grad=True), self._rand(h, grad=True)
        rows = []
        for backend in ("eager", "inductor"):
            fn = lambda: F.rms_norm(x, (h,), w, 1e-6)  # noqa: E731
            if backend == "inductor":
                fn = self.t.compile(fn)
            f = self._time(fn)
            if kind == "fwd":
                rows.append(
                    self._row("norm", "rms_norm fwd", f"[{t}, {h}] bf16", f, backend=backend)
                )
                continue
            fb = self._time(lambda: fn().sum().backward())  # noqa: B023
            bwd = (fb[0] - f[0], fb[1] - f[0], fb[2] - f[0])
            rows.append(
                self._row(
                    "norm",
                    "rms_norm bwd",
                    f"[{t}, {h}] bf16",
                    bwd,
                    backend=backend,
                    fwd_plus_bwd_us=fb[0],
                )
            )
        return rows

    def swiglu(self, t: int, inter: int, kind: str) -> dict[str, Any]:
        F = self.t.nn.functional
        g, u = self._rand(t, inter, grad=True), self._rand(t, inter, grad=True)
        f = self._time(lambda: F.silu(g) * u)
        if kind == "fwd":
            return self._row("elementwise", "swiglu fwd", f"[{t}, {inter}] bf16", f)
        fb = self._time(lambda: (F.silu(g) * u).sum().backward())
        return self._row(
            "elementwise",
            "swiglu bwd",
            f"[{t}, {inter}] bf16",
            (fb[0] - f[0], fb[1] - f[0], fb[2] - f[0]),
            fwd_plus_bwd_us=fb[0],
        )

    def moe(self, model: Any, t: int) -> dict[str, Any]:
        """Dropless MoE forward and backward on torch._grouped_mm, uniform routing."""
        from nki_kernels.bench.compare import expert_counts, moe_case_text

        torch = self.t
        sh = model.moe_shape()
        counts = expert_counts("uniform", t, sh.num_experts, sh.top_k)
        offs = torch.tensor(counts, device=self.dev).cumsum(0).to(torch.int32)
        rows = sum(counts)
        x = self._rand(rows, sh.hidden, grad=True)
        w_gu = self._rand(sh.num_experts, sh.hidden, 2 * sh.intermediate, grad=True)
        w_d = self._rand(sh.num_experts, sh.intermediate, sh.hidden, grad=True)

        def fwd() -> Any:
            gu = torch._grouped_mm(x, w_gu, offs=offs)
            g, u = gu.chunk(2, dim=-1)
            return torch._grouped_mm(torch.nn.functional.silu(g) * u, w_d, offs=offs)

        f = self._time(fwd)
        fb = self._time(lambda: fwd().sum().backward())
        return self._row(
            "moe",
            "moe fwd uniform",
            moe_case_text(sh, t),
            f,
            backend="torch._grouped_mm",
            fwd_plus_bwd_us=fb[0],
        )

    def rows_for(self, model: Any, ops: list[Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        done: set[tuple[Any, ...]] = set()
        for op in ops:
            key = (op.kind, op.args)
            if key in done:
                continue
            done.add(key)
            a = op.args
            if op.kind == "matmul":
                out.append(self.gemm(*a))
            elif op.kind == "attention":
                out += self.attention(*a)
            elif op.kind == "decode_attention":
                out.append(self.decode(*a))
            elif op.kind == "mla_attention":
                out += self.mla_attention(*a)
            elif op.kind == "mla_decode":
                out.append(self.mla_decode(*a))
            elif op.kind == "norm":
                out += self.norm(a[1], a[2], a[3])
            elif op.kind == "swiglu":
                out.append(self.swiglu(*a))
            elif op.kind == "moe" and a[1] == "fwd":
                out.append(self.moe(model, a[0]))
            print(f"measured {op.name}", file=sys.stderr, flush=True)
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--phase", choices=("train", "prefill", "decode"), default="train")
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=None, help="default 1 (decode 64)")
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument(
        "--out", type=Path, default=Path("gpu_rows.jsonl"), help="JSON lines (appended)"
    )
    a = ap.parse_args(argv)
    batch = a.batch or (64 if a.phase == "decode" else 1)
    try:
        model, *ops = ledger_ops(a.model, a.phase, batch, a.seq, a.context)
    except ValueError as exc:
        print(f"gpu_peers: {exc}", file=sys.stderr)
        return 2
    try:
        torch = require_cuda()
    except CudaUnavailable as exc:
        print(f"gpu_peers: CudaUnavailable: {exc}", file=sys.stderr)
        return 2
    rows = Measurer(torch, a.warmup, a.reps).rows_for(model, ops)
    with a.out.open("a") as f:
        for r in rows:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    print(f"{len(rows)} rows appended to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
