"""Kernel launch: numpy / torch in and out, in-place write-back, LNC2, targets, trace-only
mode and the nki.jit argument rules."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from tile_harness import expect_rule

from nki_kernels.interp import TensorSpec, nisa, nki, nl, run, settings

BF16 = np.dtype(ml_dtypes.bfloat16)
rng = np.random.default_rng(23)


@nki.jit
def scale_rows(x, factor):
    """out = x * factor (one 128-row tile at a time)."""
    n, f = x.shape
    out = nl.ndarray((n, f), x.dtype, buffer=nl.shared_hbm)
    for r0 in range(0, n, 128):
        rows = min(128, n - r0)
        t = nl.ndarray((128, f), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[0:rows], src=x[r0 : r0 + rows])
        nisa.tensor_scalar(dst=t[0:rows], data=t[0:rows], op0=nl.multiply, operand0=factor)
        nisa.dma_copy(dst=out[r0 : r0 + rows], src=t[0:rows])
    return out


@nki.jit
def add_one_in_place(x):
    """x += 1, written back into the caller's array."""
    n, f = x.shape
    t = nl.ndarray((n, f), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
    nisa.dma_copy(dst=x, src=t)


_raises = expect_rule


# ---- array kinds ---------------------------------------------------------------------------
def test_numpy_in_numpy_out_with_ragged_rows():
    x = rng.standard_normal((300, 10)).astype(np.float32)
    out = scale_rows(x, 2.5)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    np.testing.assert_array_equal(out, x * np.float32(2.5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_torch_in_torch_out_keeps_dtype(dtype):
    x = torch.randn(130, 7).to(dtype)
    out = scale_rows(x, 2.0)
    assert isinstance(out, torch.Tensor) and out.dtype == dtype and out.device.type == "cpu"
    assert torch.equal(out, x * 2)


def test_torch_fp8_round_trips_bits():
    x = torch.randn(4, 8).to(torch.float8_e4m3fn)
    out = scale_rows(x, 1.0)
    assert out.dtype == torch.float8_e4m3fn
    assert torch.equal(out.view(torch.uint8), x.view(torch.uint8))


def test_numpy_inputs_mutated_in_place_are_written_back():
    x = rng.standard_normal((5, 6)).astype(np.float32)
    before = x.copy()
    assert add_one_in_place(x) is None
    np.testing.assert_array_equal(x, before + 1)
    xb = before.astype(BF16)
    add_one_in_place(xb)
    np.testing.assert_array_equal(xb, (before.astype(BF16).astype(np.float32) + 1).astype(BF16))


def test_non_contiguous_numpy_input_is_written_back_through_the_view():
    base = np.zeros((6, 8), np.float32)
    view = base[::2, 1:5]
    add_one_in_place(view)
    assert (base[::2, 1:5] == 1).all() and base.sum() == 12


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_inputs_mutated_in_place_are_written_back(dtype):
    x = torch.randn(3, 4).to(dtype)
    before = x.clone()
    add_one_in_place(x)
    assert torch.equal(x, before + 1)
    leaf = torch.zeros(2, 2, requires_grad=True)
    add_one_in_place(leaf)
    assert torch.equal(leaf.detach(), torch.ones(2, 2))


def test_unwritten_read_only_input_is_left_alone():
    x = np.ones((4, 4), np.float32)
    x.flags.writeable = False
    np.testing.assert_array_equal(scale_rows(x, 3.0), 3 * x)


def test_an_input_the_kernel_only_reads_is_not_copied_and_a_written_one_is():
    seen = []

    @nki.jit
    def probe(x, y):
        seen.append((x.storage, y.storage))
        add_one_in_place.fn(y)
        return scale_rows.fn(x, 2.0)

    x = rng.standard_normal((130, 6)).astype(np.float32)
    y = np.zeros((4, 4), np.float32)
    out = probe(x, y)
    np.testing.assert_array_equal(out, 2 * x)
    ((xs, ys),) = seen
    assert np.shares_memory(xs.data, x) and not xs.data.flags.writeable  # borrowed
    assert not np.shares_memory(ys.data, y)  # its own copy from the first write on
    np.testing.assert_array_equal(y, np.ones((4, 4), np.float32))  # written back


# ---- LNC2 -------------------------------------------------------------------------------
def test_program_ids_and_shared_hbm_canonicalization():
    seen = []

    @nki.jit
    def halves(x):
        n, f = x.shape
        out = nl.ndarray((n, f), x.dtype, buffer=nl.shared_hbm)
        nprog = nl.num_programs(0) if nl.program_ndim() != 0 else 1
        pid = nl.program_id(0) if nl.program_ndim() != 0 else 0
        seen.append((nl.program_ndim(), nprog, pid))
        lo, hi = pid * n // nprog, (pid + 1) * n // nprog
        t = nl.ndarray((hi - lo, f), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[lo:hi])
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=float(10 * (pid + 1)))
        nisa.dma_copy(dst=out[lo:hi], src=t)
        return out

    x = rng.standard_normal((6, 3)).astype(np.float32)
    np.testing.assert_array_equal(halves[2](x), np.concatenate([x[:3] + 10, x[3:] + 20]))
    assert seen == [(1, 2, 0), (1, 2, 1)]
    seen.clear()
    np.testing.assert_array_equal(halves(x), x + 10)
    assert seen == [(0, 1, 0)]
    seen.clear()
    halves[1](x)
    assert seen == [(1, 1, 0)]


def test_run_accepts_an_indexed_kernel():
    res = run(scale_rows[2], np.ones((256, 4), np.float32), 2.0)
    assert res.trace.lnc == 2 and {i.program for i in res.trace} == {0, 1}
    np.testing.assert_array_equal(res.outputs, np.full((256, 4), 2.0, np.float32))


def test_lnc2_inputs_are_shared_hbm_and_memory_is_per_core():
    seen = {}

    def kernel(x):
        seen.setdefault("buffers", []).append(x.buffer)
        nl.ndarray((128, 100 * 1024 // 4), nl.float32, buffer=nl.sbuf)  # 100 KiB per core

    res = run(kernel, np.zeros((2, 2), np.float32), lnc=2)
    assert seen["buffers"] == [nl.shared_hbm, nl.shared_hbm]
    assert res.trace.peak_sbuf_bytes == [102400, 102400]


def test_shared_hbm_allocations_must_line_up_between_programs():
    def kernel():
        shape = (4, 4) if nl.program_id(0) == 0 else (4, 5)
        nl.ndarray(shape, nl.float32, buffer=nl.shared_hbm)

    err = _raises("LAUNCH", run, kernel, lnc=2)
    assert "differs between programs" in str(err)


@pytest.mark.parametrize("bad", [(2, 2), 3, 0, "2"])
def test_lnc_takes_one_int_of_1_or_2(bad):
    _raises("LAUNCH", lambda: scale_rows[bad])


def test_run_rejects_bad_lnc():
    _raises("LAUNCH", run, scale_rows, np.zeros((2, 2), np.float32), 1.0, lnc=4)


# ---- targets ----------------------------------------------------------------------------
def _version():
    got = {}

    def kernel():
        got["v"] = nisa.get_nc_version()
        got["sbuf"] = nl.tile_size.sbuf_fmax_bytes

    return kernel, got


def test_target_per_call_env_override_and_settings(monkeypatch):
    kernel, got = _version()
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)
    run(kernel)
    assert got["v"] == nisa.nc_version.gen3  # project default: trn2
    for name, version in (("trn1", 2), ("gen3", 3), ("trn3", 4), ("inf2", 2)):
        run(kernel, target=name)
        assert got["v"] == version and got["v"] >= nisa.nc_version.gen2
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "gen4")
    run(kernel)
    assert got["v"] == nisa.nc_version.gen4
    run(kernel, target="trn1")  # an explicit target wins over the environment
    assert got["v"] == nisa.nc_version.gen2
    with settings(target="trn2"):
        run(kernel)
        assert got["v"] == nisa.nc_version.gen3
    run(kernel)
    assert got["v"] == nisa.nc_version.gen4


def test_sbuf_budget_follows_the_target():
    kernel, got = _version()
    sizes = {}
    for name in ("trn1", "trn2", "trn3"):
        run(kernel, target=name)
        sizes[name] = got["sbuf"]
    assert sizes["trn1"] < sizes["trn2"] < sizes["trn3"]


def test_unknown_target_names_the_choices():
    with pytest.raises(ValueError, match=r"trn1.*trn2.*trn3"):
        run(lambda: None, target="trn9")


# ---- nki.jit argument rules -------------------------------------------------------------
def test_jit_accepts_and_ignores_library_options():
    k = nki.jit(mode="simulation", debug_kernel=True, show_compiler_tb=False)(scale_rows.fn)
    x = np.ones((2, 2), np.float32)
    np.testing.assert_array_equal(k(x, 2.0), 2 * x)
    assert nki.simulate(k)(x, 3.0)[0, 0] == 3
    assert nki.simulate(scale_rows[2])(x, 3.0)[0, 0] == 3


def test_jit_rejects_platform_target_and_keyword_only_signatures():
    _raises("LAUNCH", nki.jit, scale_rows.fn, platform_target="trn2")

    def kw_only(x, *, y):
        return x

    _raises("LAUNCH", nki.jit, kw_only)


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ([1, 2], "lists are rejected by nki.jit; pass a tuple"),
        ({"a": 1}, "non-tensor arguments must be hashable"),
        (torch.zeros(2, device="meta"), "the interpreter takes CPU tensors; got meta"),
        (np.zeros((2, 2)), "array dtype float64 is not an NKI dtype"),
        (np.zeros((2, 2), np.int64), "array dtype int64 is not an NKI dtype"),
        (np.zeros((2, 2), object), "array dtype object is not an NKI dtype"),
        (torch.zeros(2, 2, dtype=torch.float64), "torch dtype torch.float64 is not an NKI dtype"),
        (torch.zeros(2, dtype=torch.complex64), "torch dtype torch.complex64 is not an NKI"),
        (
            np.zeros((0, 4), np.float32),
            "an NKI tensor needs every dim >= 1; got an empty array (0, 4)",
        ),
        (torch.zeros(3, 0), "an NKI tensor needs every dim >= 1; got an empty array (3, 0)"),
    ],
)
def test_unsupported_arguments_name_the_argument_and_the_problem(arg, message):
    err = _raises("LAUNCH", run, lambda a, b: None, np.zeros(1, np.float32), arg)
    assert str(err).startswith(f"argument 1: {message}")


@pytest.mark.parametrize(
    ("shape", "dtype", "rule", "message"),
    [
        ((4, -2), "float32", "LAUNCH", "shape: expected a tuple of positive ints; got (4, -2)"),
        ((), "float32", "LAUNCH", "shape: expected a tuple of positive ints; got ()"),
        (("a", 3), "float32", "LAUNCH", "shape: expected a tuple of positive ints; got ('a', 3)"),
        (7, "float32", "LAUNCH", "shape: expected a tuple of positive ints; got 7"),
        ((2, 2), "float64", "DTYPE", "dtype: expected an NKI dtype"),
        ((2, 2), np.int64, "DTYPE", "dtype: expected an NKI dtype"),
    ],
)
def test_tensor_spec_checks_its_fields(shape, dtype, rule, message):
    err = _raises(rule, TensorSpec, shape, dtype)
    assert str(err).startswith(f"TensorSpec {message}")


def test_target_of_the_wrong_type_is_refused():
    with pytest.raises(
        TypeError, match="target: expected a name such as 'trn2' or a Target; got 2"
    ):
        run(lambda: None, target=2)


def test_non_tensor_arguments_pass_through_as_python_values():
    got = {}

    def kernel(x, n, eps, flag, name, dims, dtype):
        got.update(n=n, eps=eps, flag=flag, name=name, dims=dims, dtype=dtype, shape=x.shape)

    run(kernel, np.zeros((3, 1), np.float32), 4, 1e-6, True, "rms", (1, 2), nl.bfloat16)
    assert got == dict(
        n=4, eps=1e-6, flag=True, name="rms", dims=(1, 2), dtype=nl.bfloat16, shape=(3, 1)
    )


@pytest.mark.parametrize("buffer", [nl.hbm, nl.sbuf])
def test_outputs_must_be_shared_hbm(buffer):
    def kernel():
        return nl.ndarray((2, 2), nl.float32, buffer=buffer)

    err = _raises("LAUNCH", run, kernel)
    assert "output" in str(err)


def test_returning_tuples_inputs_and_python_values():
    def kernel(x):
        o = nl.ndarray((2, 2), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=x)
        return o, x, 7

    x = np.full((2, 2), 3.0, np.float32)
    o, xin, seven = run(kernel, x).outputs
    np.testing.assert_array_equal(o, x)
    np.testing.assert_array_equal(xin, x)
    assert seven == 7


def test_language_calls_outside_a_launch_fail():
    _raises("LAUNCH", nl.ndarray, (2, 2), nl.float32)
    _raises("LAUNCH", nl.program_id, 0)


def test_isa_calls_return_an_instruction_handle():
    got = {}

    def kernel():
        t = nl.ndarray((2, 2), nl.float32)
        a = nisa.memset(dst=t, value=0.0)
        b = nisa.tensor_copy(dst=t, src=t).depends_on(a)
        got.update(a=a, b=b)

    res = run(kernel)
    assert res.trace.instrs[1] is got["b"] and got["b"].attrs["depends_on"] == [0]


# ---- trace-only mode ------------------------------------------------------------------------
def test_trace_only_matches_the_numeric_trace_and_skips_arithmetic():
    x = rng.standard_normal((300, 40)).astype(BF16)
    numeric = run(scale_rows, x, 2.0)
    spec = TensorSpec((300, 40), "bfloat16")
    traced = run(scale_rows, spec, 2.0, trace_only=True)
    assert traced.outputs == TensorSpec((300, 40), nl.bfloat16)
    sig = [(i.engine, i.opcode, i.p, i.n, i.reads, i.writes) for i in numeric.trace]
    assert sig == [(i.engine, i.opcode, i.p, i.n, i.reads, i.writes) for i in traced.trace]
    assert traced.trace.hbm_read_bytes == numeric.trace.hbm_read_bytes == 300 * 40 * 2


def test_trace_only_with_real_arrays_does_not_write_back():
    x = np.zeros((3, 3), np.float32)
    with settings(trace_only=True):
        res = run(add_one_in_place, x)
    assert (x == 0).all() and len(res.trace) == 3


def test_tensor_spec_needs_trace_only():
    _raises("LAUNCH", run, scale_rows, TensorSpec((2, 2), nl.float32), 1.0)


def test_device_print_prints_values(capsys):
    def kernel(x):
        t = nl.ndarray((1, 3), nl.float32)
        nisa.dma_copy(dst=t, src=x)
        nl.device_print("t =", t)

    run(kernel, np.array([[1.0, 2.0, 3.0]], np.float32))
    assert "t = [[1. 2. 3.]]" in capsys.readouterr().out


def test_kernel_parameters_named_like_run_options_reach_the_kernel():
    """AWS's test wrappers take `lnc` (and kernels may take `target`, `grid`): a call of the
    kernel passes them to it, they do not configure the launch."""
    got = {}

    def body(x, lnc, target, grid, trace_only):
        got.update(lnc=lnc, target=target, grid=grid, trace_only=trace_only, pid=nl.program_id(0))

    k = nki.jit(body)
    x = np.zeros((2, 2), np.float32)
    k(x, lnc=2, target="trn3", grid=7, trace_only="no")
    assert got == dict(lnc=2, target="trn3", grid=7, trace_only="no", pid=0)
    k[2](x, lnc=1, target=None, grid=None, trace_only=False)
    assert got["lnc"] == 1 and got["pid"] == 1  # two programs ran; the last was program 1
