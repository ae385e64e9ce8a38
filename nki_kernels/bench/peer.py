"""Peer rows: AWS's own nki-library kernels priced by our interpreter and cost model.

`peer_rows(checkout, ...)` imports the kernels of a local aws-neuron/nki-library checkout
unmodified (`nki_kernels.conformance.loader`: their `import nki...` resolve to the
interpreter), runs each trace-only at the benchmark's shapes and prices the trace with
the same cost model as our kernels. Nothing of AWS's code is copied into this project;
the rows (with the checkout's commit and the cost-model version) are committed as data
(`benchmarks/data/peer_rows.jsonl`) so the table shows them without the checkout.

Kernels and how they are called (signatures read from nki-library @ d2ad3a57):

- attention forward: `core/attention/attention_cte.py::attention_cte` with q [G, S, D]
  (tp_q), k [1, D, S], v [1, S, D], scale D^-1/2, `causal_mask`, `cache_softmax=True` (a
  training forward keeps the softmax statistics, as ours keeps lse). Heads are folded
  into its batch; one kv-head group (G = 4 query heads on 1 kv head, GQA) is priced and
  multiplied by the number of groups, as our rows are at S = 32K.
- attention backward: `core/attention/attention_bwd.py::attention_bwd` with q, o, dy
  [1, G, D, S], k, v [1, 1, D, S], lse [1, G, 128, S / 128], `use_causal_mask`,
  `mixed_precision=True` (its tests' default); one kv group x groups.
- rms_norm forward: nki-library @ d2ad3a57 has no standalone bf16 RMSNorm / LayerNorm
  kernel for prefill or training rows (only token-generation subkernels that keep the
  output in SBUF, and norms fused into the QKV / MLP projections), and no norm backward.
  The nearest is `core/rmsnorm/rmsnorm_quant.py::rmsnorm_quant_kernel` (RMSNorm then fp8
  row quantization): it reads the same bf16 rows and writes half the bytes, so it is
  shown as the AWS figure for `rms_norm fwd`, labelled as that kernel.
- MoE forward: `core/moe/moe_cte/moe_cte.py::moe_cte` with NxD's static dropless block
  count N = ceil((T k - (E - 1)) / 512) + (E - 1) of B = 512 rows (its tests' formula
  and block size), plus `core/router_topk/router_topk.py::router_topk` (which also does
  the router projection x W_r; ours starts from the logits). LNC 1: `shard_on_i`; LNC 2:
  its `shard_on_block` kernel launched as kernel[2] on the whole batch (AWS's own LNC 2
  split), called directly rather than through moe_cte's dispatch (see `moe_calls`).

LNC 2 rows are traced as launched at LNC 2 (`kernel[2]`: both programs interpreted and
each scheduled on its own physical core; `compare.LNC2_METHOD`), as ours: attention with
two kv heads per launch (attention_cte shards its batch of query heads, attention_bwd
its (batch, kv head) pairs over the programs) times the remaining kv groups, the norm on
the whole batch (rmsnorm_quant's 1-D SPMD row split), MoE as above.
"""

from __future__ import annotations

import math
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..interp import TensorSpec
from ..model_shapes import LLAMA3_8B_ATTN, MoEShape
from ..targets import get_target
from .rows import BenchRow

BF16, F32, I32 = "bfloat16", "float32", "int32"
NXD_BLOCK = 512
ROUTER_MAX_TOKENS = 2048
ATTN = "nkilib.core.attention"


@dataclass(frozen=True)
class PeerCall:
    """One AWS kernel launch: module and attribute, arguments, and how many times it runs."""

    kernel: str  # "attention_cte", ...
    module: str  # dotted module name inside the checkout
    attr: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    repeat: int = 1
    lnc: int = 1  # launched as kernel[lnc] (AWS's own LNC sharding) when > 1
    # builds arguments that are objects of AWS's own modules (NKIObject specs)
    object_args: Callable[[Any], dict[str, Any]] | None = None


@dataclass(frozen=True)
class PeerResult:
    """A priced peer launch, or the reason it could not be priced."""

    latency_us: float | None
    error: str = ""
    instructions: int = 0
    busiest: str = ""
    samples_us: tuple[float, ...] = ()  # latency under each of the cost model's sets


def checkout_commit(checkout: Path) -> str:
    """The checkout's git commit (short), or 'unknown' when it is not a git work tree."""
    try:
        out = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "--short=8", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def attention_calls(op: str, seq: int, causal: bool, lnc: int) -> tuple[list[PeerCall], int]:
    """The AWS launches of one Llama-3 8B attention case (one kv group) and its multiplier."""
    s = LLAMA3_8B_ATTN
    # one kv head per program: lnc kv heads (and their query heads) per launch
    kvh, d = lnc, s.head_dim
    g = kvh * s.num_heads // s.num_kv_heads
    groups = s.num_kv_heads // kvh
    if op == "fwd":
        call = PeerCall(
            "attention_cte",
            f"{ATTN}.attention_cte",
            "attention_cte",
            (
                TensorSpec((g, seq, d), BF16),
                TensorSpec((kvh, d, seq), BF16),
                TensorSpec((kvh, seq, d), BF16),
            ),
            {
                "scale": d**-0.5,
                "causal_mask": causal,
                "tp_q": True,
                "tp_k": False,
                "cache_softmax": True,
            },
            lnc=lnc,
        )
    else:
        qs = TensorSpec((1, g, d, seq), BF16)
        kv = TensorSpec((1, kvh, d, seq), BF16)
        lse = TensorSpec((1, g, 128, seq // 128), F32)
        call = PeerCall(
            "attention_bwd",
            f"{ATTN}.attention_bwd",
            "attention_bwd",
            (qs, kv, kv, qs, qs, lse),
            {"use_causal_mask": causal, "mixed_precision": True, "softmax_scale": d**-0.5},
            lnc=lnc,
        )
    return [call], groups


def rms_norm_calls(rows: int, hidden: int, lnc: int = 1) -> list[PeerCall]:
    """rmsnorm_quant on the whole [rows, hidden] batch, launched as kernel[lnc]."""

    def kargs(mod: Any) -> dict[str, Any]:
        return {"kargs": mod.RmsNormQuantKernelArgs()}

    return [
        PeerCall(
            "rmsnorm_quant_kernel (RMSNorm + fp8 row quant)",
            "nkilib.core.rmsnorm.rmsnorm_quant",
            "rmsnorm_quant_kernel",
            (TensorSpec((1, rows, hidden), BF16), TensorSpec((hidden,), BF16)),
            lnc=lnc,
            object_args=kargs,
        )
    ]


def moe_calls(shape: MoEShape, tokens: int, lnc: int = 1) -> list[PeerCall]:
    """moe_cte + router_topk on the whole batch. At LNC 2 moe_cte runs as kernel[2] with
    its `shard_on_block` sharding (it reads the block list with a stride of 2, so it needs
    two programs); at LNC 1 with `shard_on_i` (one program owns all of I)."""
    h, i, e, k = shape.hidden, shape.intermediate, shape.num_experts, shape.top_k
    n = max(0, math.ceil((tokens * k - (e - 1)) / NXD_BLOCK)) + (e - 1)
    n = lnc * math.ceil(n / lnc)  # its tests round N up to a multiple of the shards
    tensors = (
        TensorSpec((tokens + 1, h), BF16),
        TensorSpec(((tokens + 1) * e, 1), BF16),
        TensorSpec((e, h, 2, i), BF16),
        TensorSpec((e, i, h), BF16),
    )
    tpi = TensorSpec((n * NXD_BLOCK,), I32)
    b2e = TensorSpec((n,), I32)  # 1-D, as its tests pass it (the docstring says [N, 1])
    if lnc > 1:
        # moe_cte's shard_on_block branch, called directly: the interpreter runs a @nki.jit
        # kernel called from another as a fresh LNC 1 launch (see the report), which breaks
        # this kernel's per-program block split
        moe = PeerCall(
            f"moe_cte -> bwmm_shard_on_block ({n} blocks of {NXD_BLOCK})",
            "nkilib.core.moe.moe_cte.bwmm_shard_on_block",
            "bwmm_shard_on_block",
            (*tensors, NXD_BLOCK, tpi, b2e),
            lnc=lnc,
        )
    else:

        def spec(mod: Any) -> dict[str, Any]:
            return {
                "spec": mod.MoECTESpec(
                    implementation=mod.MoECTEImplementation.shard_on_i,
                    shard_on_I=mod.ShardOnIConfig(),
                )
            }

        moe = PeerCall(
            f"moe_cte shard_on_i ({n} blocks of {NXD_BLOCK})",
            "nkilib.core.moe.moe_cte.moe_cte",
            "moe_cte",
            (*tensors, tpi, b2e, NXD_BLOCK),
            object_args=spec,
        )

    def router_args(mod: Any) -> dict[str, Any]:
        types = mod.common_types
        return {"act_fn": types.RouterActFnType.SOFTMAX}

    # router_topk is "intended for token counts T <= 2048" (its docstring; at T = 4096 and
    # H = 4096 its x tile does not fit SBUF): launched on 2048-token chunks
    rt = min(tokens, ROUTER_MAX_TOKENS)
    router = PeerCall(
        "router_topk",
        "nkilib.core.router_topk.router_topk",
        "router_topk",
        (
            TensorSpec((rt, h), BF16),
            TensorSpec((h, e), BF16),
            None,
            TensorSpec((rt, e), F32),
            TensorSpec((rt, e), F32),
            TensorSpec((rt, k), I32),
        ),
        {"k": k, "x_hbm_layout": 1, "x_sb_layout": 0, "shard_on_tokens": lnc > 1},
        repeat=-(-tokens // rt),
        lnc=lnc,
        object_args=router_args,
    )
    return [moe, router]


_PRICED: dict[str, PeerResult] = {}


def price_call(checkout: Path, call: PeerCall, target: str) -> PeerResult:
    """Trace `call` with the interpreter (trace-only) and price it; errors are returned.
    Results are memoized per (checkout, call, target) within the process."""
    key = repr((str(checkout), call.module, call.attr, call.args, call.kwargs, call.lnc, target))
    if key not in _PRICED:
        from ..perfmodel.compiled import reuse_compiled

        with reuse_compiled():  # the trace is compiled once for every parameter set
            _PRICED[key] = _price_call(checkout, call, target)
    return _PRICED[key]


def _price_call(checkout: Path, call: PeerCall, target: str) -> PeerResult:
    try:
        from ..conformance import loader
    except ImportError as e:
        return PeerResult(None, f"nki_kernels.conformance.loader not available ({e})")
    from ..perfmodel import estimate_trace, schedule, trace_kernel
    from .bands import parameter_sets

    try:
        mod = loader.load_module(checkout, call.module)
        fn = getattr(mod, call.attr)
        kernel = fn if hasattr(fn, "__getitem__") and hasattr(fn, "fn") else loader.jit(fn)
        kwargs = dict(call.kwargs)
        if call.object_args is not None:
            kwargs.update(call.object_args(mod))
        with loader.mapped_nki():
            trace = trace_kernel(kernel, *call.args, target=target, lnc=call.lnc, **kwargs)
        est = estimate_trace(trace, target)
    except Exception as e:  # the reason goes into the row: which rule or API stopped it
        msg = f"{type(e).__name__}: {e}".splitlines()[0]
        return PeerResult(None, msg[:300])
    sets = parameter_sets(target)
    samples = tuple(schedule(trace, s).latency_ns * call.repeat / 1e3 for s in sets)
    if len(sets) == 1:
        samples = ()
    return PeerResult(est.latency_ns * call.repeat / 1e3, "", len(trace), est.bottleneck, samples)


def _row(
    family: str,
    op: str,
    case: str,
    target: str,
    lnc: int,
    results: list[tuple[PeerCall, PeerResult]],
    multiplier: int,
    commit: str,
    useful_flops: float = 0.0,
) -> BenchRow:
    from ..perfmodel import modeled_label

    failed = [(c, r) for c, r in results if r.latency_us is None]
    total = sum(r.latency_us or 0.0 for _, r in results) * multiplier
    tgt = get_target(target)
    extra: dict[str, Any] = {
        "nki_library_commit": commit,
        "kernels": [c.kernel for c, _ in results],
        "instructions": [r.instructions for _, r in results],
        "multiplier": multiplier,
        "path": "AWS nki-library: " + " + ".join(c.kernel for c, _ in results),
    }
    if failed:
        extra["error"] = "; ".join(f"{c.kernel}: {r.error}" for c, r in failed)
    latency = float("nan") if failed else total
    band = None
    counts = {len(r.samples_us) for _, r in results}
    if not failed and len(counts) == 1 and 0 not in counts:
        n = counts.pop()
        samples = [sum(r.samples_us[i] for _, r in results) * multiplier for i in range(n)]
        extra["samples_us"] = samples
        from .bands import latency_band

        band = latency_band(samples, target)
    mfu = None
    if useful_flops and not failed:
        mfu = useful_flops / (total * 1e3 * tgt.tensor_peak_flops_per_ns)
    return BenchRow(
        family=family,
        op=op,
        case=case,
        target=target,
        impl="aws",
        latency_us=latency,
        provenance=modeled_label(target),
        mfu=mfu,
        bound_by=results[0][1].busiest if not failed else "",
        lnc=lnc,
        band_us=band,
        extra=extra,
    )


def peer_rows(
    checkout: str | Path,
    targets: Iterable[str] = ("trn2", "trn3"),
    lncs: Iterable[int] = (1, 2),
    seqs: Iterable[int] = (2048, 8192, 32768),
    moe_shapes: Iterable[MoEShape] = (),
    moe_tokens: Iterable[int] = (4096,),
    norm_shapes: Iterable[tuple[int, int]] = ((16384, 4096), (16384, 8192)),
    families: Iterable[str] = ("norm", "attention", "moe"),
    log: Callable[[str], None] = lambda _m: None,
) -> list[BenchRow]:
    """Every peer row (failures included, with `extra['error']` and a NaN latency)."""
    from ..attention import bench as attn
    from .compare import moe_case_text

    root = Path(checkout)
    if not (root / "src" / "nkilib_src" / "nkilib").is_dir():
        raise FileNotFoundError(
            f"checkout: expected an aws-neuron/nki-library checkout (with "
            f"src/nkilib_src/nkilib); got {root}"
        )
    commit = checkout_commit(root)
    fams = set(families)
    rows: list[BenchRow] = []
    s = LLAMA3_8B_ATTN
    for target in targets:
        for lnc in lncs:
            if "norm" in fams:
                for n, h in norm_shapes:
                    calls = rms_norm_calls(n, h, lnc)
                    res = [(c, price_call(root, c, target)) for c in calls]
                    rows.append(
                        _row(
                            "norm", "rms_norm fwd", f"[{n}, {h}] bf16", target, lnc, res, 1, commit
                        )
                    )
            if "attention" in fams:
                for seq in seqs:
                    for causal in (False, True):
                        for op in ("fwd", "bwd"):
                            t0 = time.perf_counter()
                            calls, mult = attention_calls(op, seq, causal, lnc)
                            res = [(c, price_call(root, c, target)) for c in calls]
                            name = f"flash_attention {op}" + (" causal" if causal else "")
                            case = (
                                f"B=1 H={s.num_heads}/{s.num_kv_heads} S={seq} D={s.head_dim} bf16"
                            )
                            flops = attn.useful_flops(
                                op, seq, seq, s.head_dim, s.num_heads // lnc, 1, causal
                            )
                            rows.append(
                                _row("attention", name, case, target, lnc, res, mult, commit, flops)
                            )
                            took = time.perf_counter() - t0
                            log(f"{target} LNC {lnc} {name} S={seq}: {took:.0f} s")
            if "moe" in fams:
                for shape in moe_shapes:
                    for t in moe_tokens:
                        part = -(-t // lnc)  # tokens per core, for the MFU
                        calls = moe_calls(shape, t, lnc)
                        res = [(c, price_call(root, c, target)) for c in calls]
                        flops = 2.0 * part * shape.top_k * 3 * shape.hidden * shape.intermediate
                        for routing in ("uniform", "skewed"):  # static N blocks: routing-free
                            rows.append(
                                _row(
                                    "moe",
                                    f"moe_mlp fwd {routing}",
                                    moe_case_text(shape, t),
                                    target,
                                    lnc,
                                    res,
                                    1,
                                    commit,
                                    flops,
                                )
                            )
    return rows


def peer_notes(rows: Iterable[BenchRow]) -> list[str]:
    """One line per failing peer kernel: which case and what stopped it."""
    seen: dict[str, list[str]] = {}
    for r in rows:
        if r.impl == "aws" and r.extra.get("error"):
            seen.setdefault(r.extra["error"], []).append(f"{r.op} {r.case} {r.target} LNC {r.lnc}")
    return [f"{err}  [{len(cases)} cases, e.g. {cases[0]}]" for err, cases in seen.items()]
