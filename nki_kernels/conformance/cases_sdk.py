"""Cases for the kernels of the aws-neuron-sdk's `nki/examples` (NKI 0.6 docs).

Shapes are the examples' own where they are small, else the smallest the kernel's
asserts allow. References: the NumPy reference an example ships
(`np_average_pool_2D`) or, where the example checks against a torch expression that
needs a device (`torch_xla`), the same expression in NumPy, written here.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from .runner import Case

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.float32


def _f(a: Any) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def _exp_ref(ctx: Any, args: Any, kw: Any) -> Any:
    return np.exp(_f(args[0]))


def _add_ref(ctx: Any, args: Any, kw: Any) -> Any:
    return _f(args[0]) + _f(args[1])


def _matmul_ref(ctx: Any, args: Any, kw: Any) -> Any:
    return _f(args[0]).T @ _f(args[1])


def _mamba_ref(ctx: Any, args: Any, kw: Any) -> Any:
    """The selective scan the example's torch `mamba_layer` computes, in NumPy."""
    delta, u, a, b, c = (_f(x) for x in args)
    d_a = np.exp(delta[:, :, None, :] * a[None, :, :, None])  # (batch, ch, state, seq)
    d_bu = delta[:, :, None, :] * b[:, None, :, :] * u[:, :, None, :]
    h = np.zeros(d_a.shape[:3])
    ys = []
    for t in range(d_a.shape[3]):
        h = d_a[..., t] * h + d_bu[..., t]
        ys.append((h * c[:, None, :, t]).sum(axis=2))
    return np.stack(ys, axis=-1)


def _mamba_inputs(rng: np.random.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
    batch, channels, state, seq = 1, 256, 16, 512
    delta = rng.uniform(0.0, 0.1, (batch, channels, seq)).astype(F32)
    u = rng.standard_normal((batch, channels, seq)).astype(F32)
    a = -rng.uniform(0.5, 1.5, (channels, state)).astype(F32)  # negative: a stable scan
    b = rng.standard_normal((batch, state, seq)).astype(F32)
    c = rng.standard_normal((batch, state, seq)).astype(F32)
    return (delta, u, a, b, c), {}


def _avgpool_ref(ctx: Any, args: Any, kw: Any) -> Any:
    fn = ctx.load("average_pool2d.average_pool2d_nki_kernels", "np_average_pool_2D")
    return fn(args[0].astype(np.float32), args[1])


def _maxpool_ref(ctx: Any, args: Any, kw: Any) -> Any:
    x, p = _f(args[0]), args[1]
    c, h, w = x.shape
    return x.reshape(c, h // p, p, w // p, p).max(axis=(2, 4))


def _transpose_ref(ctx: Any, args: Any, kw: Any) -> Any:
    x, (rows, cols) = args
    return x.reshape(x.shape[0], rows, cols).transpose(0, 2, 1).reshape(x.shape[0], -1)


def _split_ref(ctx: Any, args: Any, kw: Any) -> Any:
    return _f(args[0])[:, 0::2], _f(args[0])[:, 1::2]


def _two(shape: tuple[int, ...], dtype: Any) -> Any:
    def build(rng: np.random.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (
            rng.standard_normal(shape).astype(dtype),
            rng.standard_normal(shape).astype(dtype),
        ), {}

    return build


def _one(shape: tuple[int, ...], dtype: Any, *extra: Any, scale: float = 1.0) -> Any:
    def build(rng: np.random.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return ((rng.standard_normal(shape) * scale).astype(dtype), *extra), {}

    return build


def _matmul(m: int, k: int, n: int, **kw: Any) -> Any:
    def build(rng: np.random.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
        lhs = rng.random((m, k)).astype(BF16)
        rhs = rng.random((k, n)).astype(BF16)
        return (np.ascontiguousarray(lhs.T), rhs), dict(kw)

    return build


MM = "matrix_multiplication.matrix_multiplication_nki_kernels"
MAMBA = "fused_mamba.mamba_nki_kernels"

CASES: list[Case] = [
    Case("getting_started_baremetal", "add (4, 3) fp16", "getting_started_baremetal",
         "nki_tensor_add_kernel", _two((4, 3), np.float16), _add_ref),
    Case("getting_started_torch", "add (4, 3) bf16", "getting_started_torch",
         "nki_tensor_add_kernel", _two((4, 3), BF16), _add_ref),
    Case("simulate add_kernel", "(128, 512) fp32", "simulate.nki_simulate_example",
         "add_kernel", _two((128, 512), F32), _add_ref, rtol=1e-5, atol=1e-6),
    Case("tensor_addition", "(256, 1024) bf16", "tensor_addition.tensor_addition_nki_kernels",
         "nki_tensor_add", _two((256, 1024), BF16), _add_ref),
    Case("layout-pass", "exp (128, 512) bf16", "layout-pass", "tensor_exp_kernel_",
         _one((128, 512), BF16, scale=0.5), _exp_ref),
    Case("layout-violation", "exp (256, 512): the docs' partition-limit violation",
         "layout-violation", "tensor_exp_kernel_", _one((256, 512), BF16), expect_rule="TC1"),
    Case("layout-loop", "exp (256, 512) bf16", "layout-loop", "tensor_exp_kernel_",
         _one((256, 512), BF16, scale=0.5), _exp_ref),
    Case("layout-dynamic-loop", "exp (300, 64) bf16", "layout-dynamic-loop",
         "tensor_exp_kernel_", _one((300, 64), BF16, scale=0.5), _exp_ref),
    Case("index-case-1", "split (4, 5) bf16", "index-case-1", "tensor_split_kernel_",
         _one((4, 5), BF16), _split_ref),
    Case("index-case-3", "maxpool (2, 6, 6) / 2 bf16", "index-case-3", "tensor_maxpool_kernel_",
         _one((2, 6, 6), BF16, 2), _maxpool_ref),
    Case("average_pool2d", "(2, 6, 6) / 2 fp16", "average_pool2d.average_pool2d_nki_kernels",
         "tensor_avgpool_kernel", _one((2, 6, 6), np.float16, 2), _avgpool_ref),
    Case("transpose2d", "(5, 3x4) int8", "transpose2d.transpose2d_nki_kernels",
         "tensor_transpose2D_kernel_",
         lambda rng: ((rng.integers(-100, 100, (5, 12)).astype(np.int8), (3, 4)), {}),
         _transpose_ref, rtol=0, atol=0),
    Case("nki_matmul_basic_", "64x128 @ 128x512 bf16", MM, "nki_matmul_basic_",
         _matmul(64, 128, 512), _matmul_ref, rtol=1e-2, atol=1e-4),
    Case("nki_matmul_tiled_", "256x256 @ 256x1024 bf16", MM, "nki_matmul_tiled_",
         _matmul(256, 256, 1024), _matmul_ref, rtol=1e-2, atol=1e-4),
    Case("nki_matmul_hoist_load_", "256x256 @ 256x1024 bf16", MM, "nki_matmul_hoist_load_",
         _matmul(256, 256, 1024), _matmul_ref, rtol=1e-2, atol=1e-4),
    Case("nki_matmul_block_free_dimension_", "256x256 @ 256x2048 bf16", MM,
         "nki_matmul_block_free_dimension_", _matmul(256, 256, 2048), _matmul_ref, rtol=1e-2,
         atol=1e-4),
    Case("nki_matmul_fully_optimized_", "512x256 @ 256x1024 bf16, blocks 2/2/2", MM,
         "nki_matmul_fully_optimized_",
         _matmul(512, 256, 1024, TILES_IN_BLOCK_M=2, TILES_IN_BLOCK_N=2, TILES_IN_BLOCK_K=2),
         _matmul_ref),
    Case("mamba_v1", "1x256 ch x16 state x512 fp32", MAMBA, "mamba_v1", _mamba_inputs,
         _mamba_ref),
    Case("mamba_v2", "1x256 ch x16 state x512 fp32", MAMBA, "mamba_v2", _mamba_inputs,
         _mamba_ref),
    Case("mamba_v3", "1x256 ch x16 state x512 fp32", MAMBA, "mamba_v3", _mamba_inputs,
         _mamba_ref),
]  # fmt: skip
