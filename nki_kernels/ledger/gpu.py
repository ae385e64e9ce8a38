"""GPU figures of the ledger's ops, from measured rows (`benchmarks/data/gpu_rows.jsonl`).

The rows are measurements (CUDA events, medians after warm-up; each row names its
device, software and method): the committed file is the H200 rows of
`benchmarks/gpu_peers.py`'s format. An op whose exact case was measured gets the
measured figure, labelled "measured (device, torch, CUDA)". Every other op is
**derived** from measured rows and labelled "derived from measured rows (...)", with the
derivation named: attention interpolated in S (log-log) and scaled by query heads; a
matmul at a measured GEMM's throughput (its forward or backward TFLOP/s), or at the
measured HBM bandwidth when that is slower (small-M decode matmuls); element-wise
passes at the measured HBM bandwidth; norms scaled by rows; an MoE layer scaled by
routed FLOPs, or at the HBM bandwidth over the touched experts' weights when that is
slower (a decode step's few tokens), and its backward as twice its forward; DeepSeek's
expanded MLA attention (q / k 192, v 128 wide, 128 heads) from the causal SDPA rows at
head dim 128 by FLOPs (`mla_attention`). The ledger reports how much of each GPU total
is measured directly.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .figure import Figure
from .layers import Op
from .models import ModelSpec
from .store import DATA

GPU_ROWS = DATA / "gpu_rows.jsonl"
# ops whose GPU figure may be missing (`benchmarks/gpu_peers.py` measures both; the
# committed H200 rows have neither): MLA attention is derived from the causal SDPA rows
# when the rows have them; the absorbed decode (einsum + softmax over a shared 576-wide
# latent, eager) is no kind of op a measured row is, so only its own row covers it
MISSING = {
    "mla_attention": "MLA attention (no measured row, and no causal SDPA row to derive it from)",
    "mla_decode": "absorbed MLA decode (no measured row)",
}


@dataclass
class GpuRows:
    rows: list[dict[str, Any]]
    path: Path

    @classmethod
    def load(cls, path: str | Path = GPU_ROWS) -> GpuRows:
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as exc:
            raise ValueError(f"--gpu-rows: cannot read {p}: {exc}") from None
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    raise ValueError(f"--gpu-rows: {p}:{n} is not a JSON row") from None
        if not rows:
            raise ValueError(f"--gpu-rows: {p} holds no rows")
        return cls(rows, p)

    @property
    def device(self) -> str:
        return str(self.rows[0].get("device", "GPU"))

    def software(self) -> str:
        r = self.rows[0]
        return f"torch {r.get('torch', '?')}, CUDA {r.get('cuda', '?')}"

    def measured_label(self) -> str:
        return f"measured ({self.device}, {self.software()})"

    def derived_label(self) -> str:
        return f"derived from measured rows ({self.device}, {self.software()})"

    def find(self, op: str, case: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["op"] == op and (case is None or r.get("case") == case)]

    def hbm_bytes_per_us(self) -> float:
        """The best HBM bandwidth a measured row reached (decode attention rows)."""
        bw = [r["hbm_GBps"] for r in self.rows if r.get("hbm_GBps")]
        if not bw:
            raise ValueError(f"{self.path}: no row with hbm_GBps to derive bandwidth from")
        return max(bw) * 1e3  # GB/s -> bytes/us

    def _fig(self, us: float, row: dict[str, Any], source: str) -> Figure:
        return Figure(us, self.measured_label(), source)

    # ---- ops --------------------------------------------------------------------------
    def matmul(self, m: int, k: int, n: int, direction: str) -> Figure:
        flops = 2.0 * m * k * n
        gemms = [r for r in self.rows if r.get("family") == "gemm"]
        for r in gemms:
            # a plain GEMM row ("matmul", gpu_peers.py) is any direction's GEMM of its shape;
            # a model-named row is the forward of that projection
            plain = r["op"] == "matmul" or direction == "fwd"
            if r["case"] == f"[{m}, {k}] x [{k}, {n}] bf16" and plain:
                return self._fig(r["latency_us"], r, f"{r['op']} {r['case']}")
        if not gemms:
            raise ValueError(f"{self.path}: no GEMM rows")

        # the measured GEMM nearest in shape (log distance over M, K, N)
        def dist(r: dict[str, Any]) -> float:
            a, b = r["case"].split(" x ")
            mm, kk = (int(x) for x in a.strip("[]").split(", "))
            nn = int(b.split("]")[0].split(", ")[1])
            return sum(abs(math.log(x / y)) for x, y in ((mm, m), (kk, k), (nn, n)))

        usable = [r for r in gemms if direction == "fwd" or r.get("fwd_plus_bwd_us")]
        r = min(usable or gemms, key=dist)
        if direction != "fwd" and not r.get("fwd_plus_bwd_us"):
            direction = "fwd"  # no backward measured near this shape: the forward's rate
        fwd = r["latency_us"]
        rate = (
            2.0
            * _mkn(r["case"])
            / (fwd if direction == "fwd" else (r["fwd_plus_bwd_us"] - fwd) / 2)
        )
        bytes_ = 2.0 * (m * k + k * n + m * n)
        t_flop, t_mem = flops / rate, bytes_ / self.hbm_bytes_per_us()
        how = "its FLOP rate" if t_flop >= t_mem else "the measured HBM bandwidth"
        return Figure(
            max(t_flop, t_mem),
            self.derived_label(),
            f"[{m}, {k}] x [{k}, {n}] at {how} ({direction} of {r['op']} {r['case']})",
        )

    def attention(self, kind: str, seq: int, batch: int, heads: int, kv: int = 8) -> Figure | None:
        op = f"sdpa {kind} causal"
        pts: dict[int, tuple[float, str]] = {}
        rows = self.find(op)
        same = [r for r in rows if f"H={heads}/{kv} " in r["case"]]
        rows_heads = heads if same else 32
        for r in same or [r for r in rows if "H=32/8 " in r["case"]]:
            s = int(r["case"].split("S=")[1].split()[0])
            b = int(r["case"].split("B=")[1].split()[0])
            if b != 1:
                continue
            if s not in pts or r["latency_us"] < pts[s][0]:
                pts[s] = (r["latency_us"], r.get("backend", ""))
        if not pts:
            return None
        if seq in pts:
            us, be = pts[seq]
            f = Figure(us, self.measured_label(), f"{op} S={seq} ({be}, the faster backend)")
        else:
            ss = sorted(pts)
            lo = max([s for s in ss if s < seq], default=ss[0])
            hi = min([s for s in ss if s > seq], default=ss[-1])
            if lo == hi:
                lo, hi = (ss[0], ss[1]) if seq < ss[0] else (ss[-2], ss[-1])
            e = math.log(pts[hi][0] / pts[lo][0]) / math.log(hi / lo)
            f = Figure(
                pts[lo][0] * (seq / lo) ** e,
                self.derived_label(),
                f"{op} at S={lo} and {hi} ({pts[lo][1]} / {pts[hi][1]}), S^{e:.2f} to S={seq}",
            )
        if heads != rows_heads:
            f = Figure(
                f.us * heads / 32, self.derived_label(), f"{f.source}; x query heads {heads}/32"
            )
        if not same and kv != 8:
            f = Figure(f.us, self.derived_label(), f"{f.source}; rows have 8 kv heads, not {kv}")
        return f.scaled(batch, f"x {batch} sequences") if batch != 1 else f

    def decode_attention(self, batch: int, ctx: int, heads: int, kv: int) -> Figure | None:
        rows = self.find("sdpa decode (1 query)")
        if not rows:
            return None
        for r in rows:
            if r["case"] == f"B={batch} Hq={heads} Hkv={kv} L={ctx} D=128 bf16":
                return self._fig(r["latency_us"], r, f"sdpa decode {r['case']}")
        rows = [r for r in rows if "Hkv=8 " in r["case"]] or rows

        def bl(r: dict[str, Any]) -> float:
            c = r["case"]
            return int(c.split("B=")[1].split()[0]) * int(c.split("L=")[1].split()[0])

        r = min(rows, key=lambda r: abs(math.log(bl(r) / (batch * ctx))))
        k = batch * ctx / bl(r) * kv / 8
        return Figure(
            r["latency_us"] * k,
            self.derived_label(),
            f"sdpa decode {r['case']} scaled by K/V bytes (x {k:.3g})",
        )

    def norm(self, op: str, kind: str, t: int, h: int) -> Figure:
        name = f"rms_norm {kind}"
        cands = [r for r in self.find(name) if r["case"].startswith("[")]
        if not cands:
            raise ValueError(f"{self.path}: no {name} rows")
        same_h = [r for r in cands if r["case"].split(", ")[1].split("]")[0] == str(h)]
        pool = same_h or cands
        r = min(pool, key=lambda r: r["latency_us"])
        rows = int(r["case"][1:].split(",")[0])
        hh = int(r["case"].split(", ")[1].split("]")[0])
        k = t * h / (rows * hh)
        src = f"{name} {r['case']} ({r.get('backend', '')}, the faster)"
        note = "" if op == "rms_norm" else " (the residual add not included)"
        if k == 1 and op == "rms_norm":
            return self._fig(r["latency_us"], r, src)
        return Figure(
            r["latency_us"] * k, self.derived_label(), f"{src} x {k:.3g} by elements{note}"
        )

    def swiglu(self, t: int, inter: int, kind: str) -> Figure:
        for r in self.find(f"swiglu {kind}", f"[{t}, {inter}] bf16"):
            return self._fig(r["latency_us"], r, f"swiglu {kind} {r['case']}")
        tensors = 3 if kind == "fwd" else 5  # read g, u, write h / read dh, g, u, write dg, du
        b = tensors * t * inter * 2.0
        return Figure(
            b / self.hbm_bytes_per_us(),
            self.derived_label(),
            f"{tensors} [{t}, {inter}] bf16 tensors at the measured HBM bandwidth",
        )

    def moe(self, model: ModelSpec, t: int, kind: str) -> Figure | None:
        rows = self.find("moe fwd uniform")
        if not rows:
            return None
        sh = model.moe_shape()
        from ..bench.compare import moe_case_text

        case = moe_case_text(sh, t)
        exact = [r for r in rows if r["case"] == case]
        if exact and kind == "fwd":
            return self._fig(exact[0]["latency_us"], exact[0], f"moe fwd uniform {case}")
        if exact and exact[0].get("fwd_plus_bwd_us"):
            r = exact[0]
            bwd = r["fwd_plus_bwd_us"] - r["latency_us"]
            return self._fig(bwd, r, f"moe fwd + bwd - fwd, {case}")
        flops = 2.0 * t * sh.top_k * 3 * sh.hidden * sh.intermediate
        r = (
            exact[0]
            if exact
            else min(rows, key=lambda r: abs(math.log(_moe_experts(r) / sh.num_experts)))
        )
        fwd = r["latency_us"] * flops / _moe_flops(r["case"])
        how = "" if exact else f" scaled by routed FLOPs from {r['case']}"
        # a few tokens touch most experts: the forward then streams their weights, a
        # floor the FLOP scaling of a many-token row does not see
        e, k = sh.num_experts, sh.top_k
        touched = e * (1.0 - (1.0 - k / e) ** t)  # expected distinct experts, uniform routing
        weights_us = touched * 3 * sh.hidden * sh.intermediate * 2.0 / self.hbm_bytes_per_us()
        if weights_us > fwd:
            fwd = weights_us
            how = (
                f" at the measured HBM bandwidth: the weights of the {touched:.0f} of {e} "
                "experts uniform routing touches (their FLOPs, scaled from "
                f"{r['case']}, take less)"
            )
        if kind == "fwd":
            return Figure(fwd, self.derived_label(), f"moe fwd{how}")
        return Figure(
            2 * fwd,
            self.derived_label(),
            f"2 x the forward{how} (backward FLOPs are twice the forward's; it reads the "
            "weights and writes their gradients)",
        )

    def mla_attention(
        self, kind: str, seq: int, batch: int, heads: int, d_qk: int, d_v: int
    ) -> Figure | None:
        """Expanded MLA from the causal SDPA rows (32 query heads, head dim 128, the
        faster backend; interpolated in S as `attention`), scaled by FLOPs: x heads / 32,
        and by the head dims of its products -- forward Q K^T (d_qk) and P V (d_v) vs
        2 x 128; backward S recomputed, dQ, dK (d_qk) and dP, dV (d_v) vs 5 x 128. It
        assumes the D = 128 rows' FLOP rate holds at q / k 192, v 128 (torch's flash
        backend takes one head dim for q, k and v, so another backend may run it)."""
        base = self.attention(kind, seq, 1, 32, 8)
        if base is None:
            return None
        if kind == "fwd":
            k_dim, how = (d_qk + d_v) / 256, f"({d_qk} + {d_v}) / (2 x 128)"
        else:
            k_dim, how = (3 * d_qk + 2 * d_v) / 640, f"(3 x {d_qk} + 2 x {d_v}) / (5 x 128)"
        f = Figure(
            base.us * heads / 32 * k_dim,
            self.derived_label(),
            f"by FLOPs from {base.source}: x query heads {heads}/32, x head dims {how}; "
            "assumes the D = 128 rows' FLOP rate at these head dims",
        )
        return f.scaled(batch, f"x {batch} sequences") if batch != 1 else f

    def exact(self, op: str, case: str) -> Figure | None:
        """The measured row of exactly this op and case (None: not measured, and no
        row near enough in kind to derive it from)."""
        for r in self.find(op, case):
            return self._fig(r["latency_us"], r, f"{op} {case}")
        return None

    def whole_layer(self, model: ModelSpec, seq: int) -> dict[str, Any] | None:
        for r in self.rows:
            if (
                r["op"].startswith(f"{model.name} decoder layer")
                and r["case"] == f"B=1 S={seq} bf16"
            ):
                return r
        return None


def _mkn(case: str) -> float:
    a, b = case.split(" x ")
    m, k = (int(x) for x in a.strip("[]").split(", "))
    n = int(b.split("]")[0].split(", ")[1])
    return float(m) * k * n


def _moe_experts(r: dict[str, Any]) -> int:
    return int(r["case"].split("E=")[1].split()[0])


def _moe_flops(case: str) -> float:
    f = {k: v for k, v in (p.split("=") for p in case.split() if "=" in p)}
    k = int(case.split("top-")[1].split()[0])
    return 2.0 * int(f["T"]) * k * 3 * int(f["H"]) * int(f["I"])


def price_op(g: GpuRows, op: Op, model: ModelSpec) -> Figure | None:
    """The GPU figure of one op (one device), or None when no row supports it."""
    a: Any = op.args
    if op.kind == "matmul":
        direction = "fwd" if op.name.endswith("fwd") else "bwd"
        return g.matmul(a[0], a[1], a[2], direction)
    if op.kind == "swiglu":
        return g.swiglu(a[0], a[1], a[2])
    if op.kind == "norm":
        return g.norm(a[0], a[1], a[2], a[3])
    if op.kind == "attention":
        return g.attention(a[0], a[1], a[2], a[3], a[4])
    if op.kind == "decode_attention":
        return g.decode_attention(a[0], a[1], a[2], a[3])
    if op.kind == "moe":
        return g.moe(model, a[0], a[1])
    if op.kind == "mla_attention":
        kind, seq, batch, heads, d_qk, d_v = a
        got = g.exact(
            f"sdpa mla {kind} causal", f"B={batch} H={heads} S={seq} D_qk={d_qk} D_v={d_v} bf16"
        )
        return got if got is not None else g.mla_attention(kind, seq, batch, heads, d_qk, d_v)
    if op.kind == "mla_decode":
        batch, ctx, heads, lat, rope = a
        return g.exact(
            "mla decode (absorbed)", f"B={batch} H={heads} L={ctx} latent={lat}+{rope} bf16"
        )
    raise ValueError(f"op kind: unknown {op.kind!r}")
