"""A simulated serving loop: tiny decoders, a scheduler, frozen shapes, checked logits.

Two tiny decoders in plain torch: Llama-style (RMSNorm, RoPE, GQA, SwiGLU) and
GPT-OSS-style (attention sinks and a sliding window on every other layer, attention
bias, clamped SwiGLU). Each attention layer owns a paged KV cache and calls
`torch.ops.nki.serving_attention` (write, then attend) with vLLM's flattened metadata.

The scheduler mixes, within a frozen token budget: prefill chunks of new requests,
prefix-cache hits (a request whose prompt starts with a cached prompt's full blocks
reuses them and starts at that length), decode rows and speculative drafts (2..4 draft
tokens fed after the last token; a random number accepted, the rejected positions'
cache entries left stale past the sequence's length). Blocks come from a free list.
Every step's inputs are padded to frozen shapes (T tokens, S sequences, max_blocks),
so one compiled graph serves every step.

`run(...)` checks every step's logits against the float64 model over each sequence's
whole history (no cache) and returns the worst relative error.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..ops.serving import serving_attention

PREFIX_ENTRIES = 6  # cached prompts kept for prefix hits (their blocks are never freed)


@dataclass(frozen=True)
class TinyConfig:
    vocab: int = 64
    hidden: int = 32
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    layers: int = 2
    gpt_oss: bool = False  # sinks + sliding window (every other layer) + attention bias
    window: int = 12


def _rope(x: Tensor, pos: Tensor) -> Tensor:
    """Rotate-half RoPE over the last dim; x [T, H, D], pos [T]."""
    d = x.shape[-1]
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = pos.to(torch.float64)[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(x.dtype)[:, None]
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(x.dtype)[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class TinyLayer(nn.Module):
    """One decoder layer's weights (attention, SwiGLU MLP, two RMSNorm gains)."""

    def __init__(self, c: TinyConfig, index: int, g: torch.Generator) -> None:
        super().__init__()
        h = c.hidden

        def w(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.randn(*shape, generator=g) / math.sqrt(shape[-1]))

        self.wq, self.wk = w(c.heads * c.head_dim, h), w(c.kv_heads * c.head_dim, h)
        self.wv, self.wo = w(c.kv_heads * c.head_dim, h), w(h, c.heads * c.head_dim)
        self.w1, self.w3, self.w2 = w(2 * h, h), w(2 * h, h), w(h, 2 * h)
        self.n1, self.n2 = nn.Parameter(torch.ones(h)), nn.Parameter(torch.ones(h))
        self.bq: nn.Parameter | None = None
        self.sinks: nn.Parameter | None = None
        if c.gpt_oss:
            self.bq = nn.Parameter(0.1 * torch.randn(c.heads * c.head_dim, generator=g))
            self.sinks = nn.Parameter(torch.randn(c.heads, generator=g))
        self.window: int | None = c.window if c.gpt_oss and index % 2 == 0 else None


class TinyDecoder(nn.Module):
    """A tiny decoder whose attention is a pluggable function (cache or dense)."""

    def __init__(self, cfg: TinyConfig, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.cfg = cfg
        self.embed = nn.Parameter(
            torch.randn(cfg.vocab, cfg.hidden, generator=g) / math.sqrt(cfg.hidden)
        )
        self.blocks = [TinyLayer(cfg, i, g) for i in range(cfg.layers)]
        self.layers = nn.ModuleList(self.blocks)
        self.norm = nn.Parameter(torch.ones(cfg.hidden))

    def forward(self, ids: Tensor, pos: Tensor, attend: Callable[..., Tensor]) -> Tensor:
        """logits [T, vocab]; attend(layer_index, layer, q, k, v) -> [T, Hq, D]."""
        c = self.cfg
        x = self.embed[ids]
        for i, layer in enumerate(self.blocks):
            y = _rms(x, layer.n1)
            q = y @ layer.wq.T
            if layer.bq is not None:
                q = q + layer.bq
            q = _rope(q.view(-1, c.heads, c.head_dim), pos)
            k = _rope((y @ layer.wk.T).view(-1, c.kv_heads, c.head_dim), pos)
            v = (y @ layer.wv.T).view(-1, c.kv_heads, c.head_dim)
            a = attend(i, layer, q, k, v)
            x = x + a.reshape(x.shape[0], -1) @ layer.wo.T
            y = _rms(x, layer.n2)
            gate, up = y @ layer.w1.T, y @ layer.w3.T
            if c.gpt_oss:  # clamped SwiGLU
                gate, up = gate.clamp(max=7.0), up.clamp(-7.0, 7.0)
            x = x + (torch.nn.functional.silu(gate) * up) @ layer.w2.T
        return _rms(x, self.norm) @ self.embed.T


def _rms(x: Tensor, w: Tensor) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def dense_attention(cfg: TinyConfig) -> Callable[..., Tensor]:
    """The plain PyTorch attention of one whole sequence (causal, window, sinks)."""

    def attend(i: int, layer: TinyLayer, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        t, g = q.shape[0], cfg.heads // cfg.kv_heads
        kk, vv = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        s = torch.einsum("qhd,khd->hqk", q, kk) / math.sqrt(cfg.head_dim)
        j = torch.arange(t)
        allowed = j[None, :] <= j[:, None]
        if layer.window is not None:
            allowed &= j[None, :] > j[:, None] - layer.window
        s = s.masked_fill(~allowed, -math.inf)
        if layer.sinks is not None:
            s = torch.cat([s, layer.sinks.to(s.dtype)[:, None, None].expand(-1, t, 1)], -1)
        p = torch.softmax(s, -1)[..., :t]
        return torch.einsum("hqk,khd->qhd", p, vv)

    return attend


@dataclass
class Request:
    rid: int
    tokens: list[int]  # accepted history (prompt + generated)
    prompt_len: int
    max_new: int = 8  # generated tokens before the request finishes
    computed: int = 0  # tokens whose K / V are in the cache
    blocks: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Frozen:
    """The frozen step shapes: tokens, sequences, blocks per sequence, pool, block size."""

    tokens: int = 24
    seqs: int = 6
    max_blocks: int = 6
    pool: int = 96
    block_size: int = 16


class Loop:
    """The scheduler and the cache-backed model step (see the module docstring)."""

    def __init__(self, cfg: TinyConfig, frozen: Frozen, seed: int = 0) -> None:
        self.cfg, self.fz = cfg, frozen
        self.rng = random.Random(seed)
        self.model = TinyDecoder(cfg, seed)
        self.ref = TinyDecoder(cfg, seed).double()
        shape = (frozen.pool, frozen.block_size, cfg.kv_heads, cfg.head_dim)
        self.caches = [
            (torch.full(shape, float("nan")), torch.full(shape, float("nan")))
            for _ in range(cfg.layers)
        ]
        self.free = list(range(1, frozen.pool))  # block 0: the padding rows' table entries
        self.running: list[Request] = []
        self.prefix: dict[tuple[int, ...], list[int]] = {}  # full prompt blocks -> block ids
        self.next_id = 0
        self.stats = {"prefill_chunks": 0, "prefix_hits": 0, "decode_rows": 0, "drafts": 0}

    def _new_request(self) -> Request:
        bs = self.fz.block_size
        shared = [p for p in self.prefix if len(p) >= bs]
        if shared and self.rng.random() < 0.5:
            base = list(self.rng.choice(shared))
            prompt = base + [
                self.rng.randrange(self.cfg.vocab) for _ in range(self.rng.randint(1, 9))
            ]
        else:
            prompt = [self.rng.randrange(self.cfg.vocab) for _ in range(self.rng.randint(3, 40))]
        req = Request(self.next_id, prompt, len(prompt), self.rng.randint(2, 14))
        self.next_id += 1
        hit = len(prompt) - 1 if len(prompt) % bs == 0 else len(prompt)
        hit = (hit // bs) * bs
        while hit and tuple(prompt[:hit]) not in self.prefix:
            hit -= bs
        if hit:
            req.blocks = list(self.prefix[tuple(prompt[:hit])])
            req.computed = hit
            self.stats["prefix_hits"] += 1
        return req

    def _ensure_blocks(self, req: Request, upto: int) -> None:
        while len(req.blocks) * self.fz.block_size < upto:
            req.blocks.append(self.free.pop(0))

    def schedule(self) -> list[tuple[Request, list[int], int]]:
        """(request, fed tokens, accepted after verification) for this step."""
        fz, budget = self.fz, self.fz.tokens
        plan: list[tuple[Request, list[int], int]] = []
        for req in list(self.running):
            if len(plan) == fz.seqs or budget < 1:
                break
            if req.computed < req.prompt_len:  # prefill chunk
                n = min(budget, req.prompt_len - req.computed)
                fed = req.tokens[req.computed : req.computed + n]
                plan.append((req, fed, n))
                self.stats["prefill_chunks"] += 1
            elif self.rng.random() < 0.4 and budget >= 3:  # speculative draft
                d = min(self.rng.randint(2, 4), budget - 1)
                fed = [req.tokens[-1]] + [self.rng.randrange(self.cfg.vocab) for _ in range(d)]
                plan.append((req, fed, self.rng.randint(1, d + 1)))
                self.stats["drafts"] += 1
            else:
                plan.append((req, [req.tokens[-1]], 1))
                self.stats["decode_rows"] += 1
            budget -= len(plan[-1][1])
        return plan

    def step_inputs(self, plan: list[tuple[Request, list[int], int]]) -> dict[str, Tensor]:
        """The step's padded tensors (frozen shapes)."""
        fz = self.fz
        ids = torch.zeros(fz.tokens, dtype=torch.long)
        pos = torch.zeros(fz.tokens, dtype=torch.long)
        slots = torch.full((fz.tokens,), -1, dtype=torch.long)
        table = torch.zeros(fz.seqs, fz.max_blocks, dtype=torch.int32)
        ctx = torch.zeros(fz.seqs, dtype=torch.int32)
        qsl = torch.zeros(fz.seqs + 1, dtype=torch.int32)
        t = 0
        for s, (req, fed, _) in enumerate(plan):
            start = req.computed if req.computed < req.prompt_len else len(req.tokens) - 1
            self._ensure_blocks(req, start + len(fed))
            for i, tok in enumerate(fed):
                p = start + i
                ids[t], pos[t] = tok, p
                slots[t] = req.blocks[p // fz.block_size] * fz.block_size + p % fz.block_size
                t += 1
            table[s, : len(req.blocks)] = torch.tensor(req.blocks, dtype=torch.int32)
            ctx[s] = start
            qsl[s + 1] = t
        qsl[len(plan) + 1 :] = t
        return {"ids": ids, "pos": pos, "slots": slots, "table": table, "ctx": ctx, "qsl": qsl}

    def forward(self, ids: Tensor, pos: Tensor, slots: Tensor, table: Tensor, ctx: Tensor,
                qsl: Tensor, *caches: Tensor) -> Tensor:  # fmt: skip
        """The cache-backed model step (what torch.compile captures)."""

        def attend(i: int, layer: TinyLayer, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            return serving_attention(
                q, caches[2 * i], caches[2 * i + 1], table, ctx, qsl, k=k, v=v,
                slot_mapping=slots, sinks=layer.sinks,
                sliding_window=layer.window, max_query_len=self.fz.tokens,
            )  # fmt: skip

        return self.model(ids, pos, attend)

    def commit(self, plan: list[tuple[Request, list[int], int]], logits: Tensor) -> None:
        """Advance each request: accepted tokens, next token = argmax of the last one."""
        t = 0
        for req, fed, acc in plan:
            if req.computed < req.prompt_len:
                req.computed += len(fed)
                if req.computed == req.prompt_len:
                    full = (req.prompt_len // self.fz.block_size) * self.fz.block_size
                    if full and len(self.prefix) < PREFIX_ENTRIES:
                        key = tuple(req.tokens[:full])
                        self.prefix.setdefault(key, req.blocks[: full // self.fz.block_size])
                    req.tokens.append(int(logits[t + len(fed) - 1].argmax()))
            else:
                req.tokens.extend(fed[1:acc])
                req.computed = len(req.tokens)
                req.tokens.append(int(logits[t + acc - 1].argmax()))
            t += len(fed)
        cap = (self.fz.max_blocks - 1) * self.fz.block_size
        keep = []
        for r in self.running:
            if len(r.tokens) + 5 < cap and len(r.tokens) - r.prompt_len < r.max_new:
                keep.append(r)
                continue
            shared = {b for blocks in self.prefix.values() for b in blocks}
            self.free.extend(b for b in r.blocks if b not in shared)  # stale data stays
        self.running = keep

    def reference_logits(self, plan: list[tuple[Request, list[int], int]]) -> Tensor:
        """float64 logits of the step's tokens from each sequence's whole history."""
        rows = []
        for req, fed, _ in plan:
            start = req.computed if req.computed < req.prompt_len else len(req.tokens) - 1
            hist = req.tokens[:start] + fed
            ids = torch.tensor(hist)
            with torch.no_grad():
                lg = self.ref(ids, torch.arange(len(hist)), dense_attention(self.cfg))
            rows.append(lg[start:])
        return torch.cat(rows)


def run(cfg: TinyConfig, steps: int, *, compiled: bool = True, seed: int = 0,
        frozen: Frozen | None = None,
        progress: Callable[[int, float], None] | None = None) -> dict[str, float]:  # fmt: skip
    """Run the loop for `steps` steps; assert-free: returns the worst relative logits
    error, the steps run and the scheduler's counts (the caller judges)."""
    loop = Loop(cfg, frozen or Frozen(), seed)
    fn: Callable[..., Tensor] = loop.forward
    if compiled:
        fn = torch.compile(loop.forward, backend="aot_eager", fullgraph=True)
    worst = 0.0
    caches = [c for pair in loop.caches for c in pair]
    for n in range(steps):
        while len(loop.running) < loop.fz.seqs and loop.rng.random() < 0.6:
            loop.running.append(loop._new_request())
        plan = loop.schedule()
        if not plan:
            continue
        x = loop.step_inputs(plan)
        with torch.no_grad():
            logits = fn(x["ids"], x["pos"], x["slots"], x["table"], x["ctx"], x["qsl"], *caches)
        n_tok = int(x["qsl"][-1])
        ref = loop.reference_logits(plan)
        err = float((logits[:n_tok].double() - ref).abs().max() / ref.abs().max())
        worst = max(worst, err)
        loop.commit(plan, logits)
        if progress is not None:
            progress(n, worst)
        if compiled and n == 0:
            torch.compiler.set_stance("fail_on_recompile")
    if compiled:
        torch.compiler.set_stance("default")
    return {
        "worst_rel_err": worst,
        "steps": float(steps),
        **{k: float(v) for k, v in loop.stats.items()},
    }


__all__ = ["Frozen", "Loop", "TinyConfig", "TinyDecoder", "TinyLayer", "dense_attention", "run"]
