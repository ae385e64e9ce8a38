"""`define_op`: define a `torch.ops.nki.<name>` custom op once, for every device.

Every op of the library (norms, attention, MoE) is defined with this one helper, so its
signature is written once -- as the type hints of its implementation -- and the schema,
fake (shape) function, autograd formula and device kernels hang off that one definition::

    from torch import Tensor
    from nki_kernels.ops import define_op

    def _fake(x, weight, eps):                       # shapes/dtypes only (FakeTensors)
        return torch.empty_like(x)

    def _setup(ctx, inputs, output):                 # save what backward needs
        x, weight, eps = inputs
        ctx.save_for_backward(x, weight)
        ctx.eps = eps

    def _backward(ctx, grad):                        # one gradient per input (None if none)
        x, weight = ctx.saved_tensors
        dx, dw = torch.ops.nki.rms_norm_bwd(grad, x, weight, ctx.eps)
        return dx, dw, None

    @define_op("rms_norm", fake=_fake, backward=_backward, setup_context=_setup,
               validate=_check_args, examples=_examples)
    def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
        \"\"\"y = x / sqrt(mean(x^2) + eps) * weight.\"\"\"
        x2, n = pad_to_bucket(x.reshape(-1, x.shape[-1]))     # rows -> their bucket
        problem = NormProblem(rows=x2.shape[0], hidden=x.shape[-1], dtype="bfloat16")
        cfg = lookup_config("rms_norm", problem, rms_norm_kernel)  # tuned, else default
        y = launch(rms_norm_kernel, x2, weight, eps, config=cfg)  # cached specialization
        return unpad(y, 0, n).reshape(x.shape)

What `define_op` does:

* schema: inferred by `torch.library.custom_op` from the implementation's type hints
  (`Tensor`, `Tensor | None`, `float`, `int`, `bool`, `Sequence[...]`, tuples of tensors as
  results); `mutates_args` names arguments written in place (none by default);
* kernels: the implementation is registered for `cpu` and for PrivateUse1 (the `neuron`
  device, real or emulated). It is device-agnostic because `runtime.launch` picks the
  backend from the tensors' device (interpreter on CPU and on the emulated device,
  TorchNeuron on a real device). `kernels={"cpu": f, "neuron": g}` overrides per device.
  Any other device gets an error naming the supported ones;
* strict options: every non-tensor `int`, `float` and `bool` argument (optional or not)
  is declared `Scalar` in the schema, so `validate` sees the value the caller passed:
  an `int` / `float` / `bool` schema type would coerce `True` to 1 (or 1.0) and 2 to
  True before any check ran (`top_k=True` would run as top_k = 1). The validators do
  the type checks (bool is rejected where a number is meant, and the reverse);
* `validate(*args)`: argument checks (raise ValueError/TypeError naming the argument),
  run before the kernel *and* before the fake, so bad input fails the same way eagerly
  and under `torch.compile`;
* `fake(*args)`: output shapes/dtypes from FakeTensors (must not read data);
* layout: every tensor output, of the kernels and of the fake alike, is made contiguous
  (row-major), whatever the inputs' strides (transposed, expanded, sliced). The kernels
  write dense row-major DRAM tensors, and a fake must report exactly the strides the
  kernel produces or `torch.compile` miscompiles views of the result;
* `backward` / `setup_context`: `torch.library.register_autograd` semantics. Without
  them the op is not differentiable (backward through it raises). Forward-mode AD
  (`torch.func.jvp`, `torch.autograd.forward_ad`) raises for every op, naming the op
  and the argument carrying the tangent (no op has a forward-mode formula);
* `bucket_policy`: every op gets a keyword-only `bucket_policy: str | None = None`
  argument (a `runtime.buckets.parse_policy` spec). The call runs under that policy, or
  under the enclosing call's / the op's / the global one (`runtime.buckets`); autograd
  runs the backward under the forward's policy. The implementation, validate and fake
  never see the argument: they pad with `pad_to_bucket(x)`, which follows it;
* `examples()`: small sample calls `[(args, kwargs), ...]` that the registry meta-test
  runs through `torch.library.opcheck` -- every op must supply them.

The op is `torch.ops.nki.<name>`; `define_op` returns an `NkiOp` (callable the same way)
and records it in `registered_ops()`. Test-only ops may use any name; the library's ops
live in `nki_kernels/ops/<family>.py`, imported by `nki_kernels.ops.load_all()`.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import re
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.types import Number

NAMESPACE = "nki"
SUPPORTED_DEVICES = ("cpu", "neuron")

Example = tuple[tuple[Any, ...], dict[str, Any]]


@dataclass(frozen=True)
class NkiOp:
    """A registered op: its name, the torch op and the pieces it was defined from."""

    name: str
    custom_op: Any = field(repr=False)
    impl: Callable[..., Any] = field(repr=False)
    fake: Callable[..., Any] = field(repr=False)
    examples: Callable[[], Iterable[Example]] | None = field(repr=False, default=None)
    differentiable: bool = False
    via_nki_op: bool = False  # defined through torch_neuronx.nki_op (see `define_op`)
    traceable: bool = False
    validate: Callable[..., Any] | None = field(repr=False, default=None)
    backward: Callable[..., Any] | None = field(repr=False, default=None)
    setup_context: Callable[..., Any] | None = field(repr=False, default=None)
    mutates_args: tuple[str, ...] = ()

    @property
    def qualname(self) -> str:
        """'nki::<name>'."""
        return f"{NAMESPACE}::{self.name}"

    @property
    def op(self) -> torch._ops.OpOverloadPacket:
        """`torch.ops.nki.<name>`."""
        return getattr(getattr(torch.ops, NAMESPACE), self.name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call `torch.ops.nki.<name>`."""
        return self.op(*args, **kwargs)


_REGISTRY: dict[str, NkiOp] = {}


def registered_ops() -> dict[str, NkiOp]:
    """Every op defined through `define_op` in this process, by name."""
    return dict(_REGISTRY)


def _privateuse1_device() -> str | None:
    """The device-type string under which PrivateUse1 kernels register, if it is ours."""
    name = torch._C._get_privateuse1_backend_name()
    return name if name in ("privateuseone", "neuron") else None


def _unsupported(name: str, impl: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(impl)
    def default(*args: Any, **kwargs: Any) -> Any:
        devices = sorted(
            {str(a.device) for a in [*args, *kwargs.values()] if isinstance(a, torch.Tensor)}
        )
        raise RuntimeError(
            f"torch.ops.{NAMESPACE}.{name}: expected tensors on one of "
            f"{', '.join(SUPPORTED_DEVICES)}; got {', '.join(devices) or 'no tensors'}"
        )

    return default


def _concrete(value: Any) -> Any:
    """A symbolic Python number as the plain number it stands for (a guard on its value).

    `torch.compile(dynamic=True)` passes float module attributes and arguments (`eps`,
    `softmax_scale`, ...) to the fake as SymFloat; the validators check plain numbers, and
    the kernels specialize on these values anyway. Unbacked values (no hint) stay as
    they are."""
    try:
        if isinstance(value, torch.SymBool):
            return bool(value)
        if isinstance(value, torch.SymInt):
            return int(value)
        if isinstance(value, torch.SymFloat):
            return float(value)
    except Exception:  # data-dependent (unbacked): nothing to specialize on
        pass
    return value


def _checked(validate: Callable[..., Any] | None, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        args = tuple(_concrete(a) for a in args)
        kwargs = {k: _concrete(v) for k, v in kwargs.items()}
        if validate is not None:
            validate(*args, **kwargs)
        return fn(*args, **kwargs)

    return run


def _contiguous(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return out.contiguous()
    if isinstance(out, (tuple, list)):
        return type(out)(_contiguous(o) for o in out)
    return out


def _dense(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with every tensor it returns made contiguous (the layout contract above)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        return _contiguous(fn(*args, **kwargs))

    return run


POLICY_ARG = "bucket_policy"


def _schema_with_policy(schema: str) -> str:
    """`schema` with the keyword-only `str? bucket_policy=None` appended to its arguments."""
    args, ret = schema.split(") -> ", 1)
    names = [a.strip() for a in args[1:].split(",") if a.strip()]
    extra = [f"str? {POLICY_ARG}=None"] if "*" in names else ["*", f"str? {POLICY_ARG}=None"]
    return "(" + ", ".join([*names, *extra]) + ") -> " + ret


def _resolve_policy(name: str, spec: str | None) -> Any:
    from ..runtime import buckets

    if spec is not None:
        return buckets.parse_policy(spec)
    return buckets._CURRENT.get() or buckets.policy_for(name)


def _policy_scope(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def run(*args: Any, bucket_policy: str | None = None, **kwargs: Any) -> Any:
        from ..runtime.buckets import using_policy

        with using_policy(_resolve_policy(name, bucket_policy)):
            return fn(*args, **kwargs)

    return run


def _policy_autograd(
    name: str, backward: Callable[..., Any], setup_context: Callable[..., Any]
) -> tuple[Callable[..., Any], Callable[..., Any]]:
    takes_kw = "keyword_only_inputs" in inspect.signature(setup_context).parameters

    def setup(ctx: Any, inputs: Any, keyword_only_inputs: Any, output: Any) -> None:
        inputs = tuple(_concrete(a) for a in inputs)
        kw = {k: _concrete(v) for k, v in keyword_only_inputs.items()}
        ctx.nki_bucket_policy = _resolve_policy(name, kw.pop(POLICY_ARG, None))
        if takes_kw:
            setup_context(ctx, inputs, kw, output)
        else:
            setup_context(ctx, inputs, output)

    def grad(ctx: Any, *grads: Any) -> Any:
        from ..runtime.buckets import using_policy

        with using_policy(ctx.nki_bucket_policy):
            return backward(ctx, *grads)

    return grad, setup


def torchneuron_nki_op() -> Callable[..., Any] | None:
    """`torch_neuronx.nki_op` when TorchNeuron is importable, else None (looked up each
    time an op is defined, so the test doubles can stand in for it)."""
    if importlib.util.find_spec("torch_neuronx") is None:
        return None
    try:
        from torch_neuronx import nki_op  # type: ignore[import-not-found]
    except ImportError:
        return None
    return nki_op  # type: ignore[no-any-return]


def _traced_body(name: str, impl: Callable[..., Any], validate: Any) -> Callable[..., Any]:
    """The op body for `nki_op`: checked, dense outputs, bucket policy scoped, with the
    signature (annotations resolved) that `nki_op` infers the schema from -- the impl's
    plus the keyword-only `bucket_policy` every op takes."""
    body = _policy_scope(name, _checked(validate, _dense(impl)))
    sig = inspect.signature(impl, eval_str=True)
    extra = inspect.Parameter(
        POLICY_ARG, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=str | None
    )
    params = [
        p.replace(annotation=_strict_annotation(p.annotation)) for p in sig.parameters.values()
    ]
    sig = sig.replace(parameters=[*params, extra])
    body.__signature__ = sig  # type: ignore[attr-defined]
    body.__annotations__ = {
        **{p.name: p.annotation for p in sig.parameters.values()},
        "return": sig.return_annotation,
    }
    del body.__wrapped__  # type: ignore[attr-defined]
    return body


_STRICT = re.compile(r"(?<![\w\[])(SymInt|int|float|bool)(\??) (\w+)")


def _strict_annotation(annotation: Any) -> Any:
    """int / float / bool (optional or not) -> `torch.types.Number`: the `Scalar` schema
    type when `nki_op` infers the schema from the signature (as `strict_schema`)."""
    if annotation in (int, float, bool):
        return Number
    if annotation in (int | None, float | None, bool | None):
        return Number | None
    return annotation


def strict_schema(schema: str) -> str:
    """`schema` with its non-tensor int / float / bool arguments declared `Scalar`
    (lists and the return types unchanged)."""
    args, arrow, rets = schema.partition(") ->")
    return _STRICT.sub(r"Scalar\2 \3", args) + arrow + rets


def define_op(
    name: str,
    impl: Callable[..., Any] | None = None,
    *,
    fake: Callable[..., Any],
    backward: Callable[..., Any] | None = None,
    setup_context: Callable[..., Any] | None = None,
    validate: Callable[..., Any] | None = None,
    kernels: Mapping[str, Callable[..., Any]] | None = None,
    mutates_args: Sequence[str] = (),
    examples: Callable[[], Iterable[Example]] | None = None,
    traceable: bool = False,
) -> Any:
    """Define `torch.ops.nki.<name>` from a type-hinted implementation (see module doc).

    Usable directly, `define_op("x", impl, fake=...)`, or as a decorator,
    `@define_op("x", fake=...)`. Returns the `NkiOp`.

    `traceable=True` says the body reads no tensor data (padding, config lookup and
    launches only), so it runs on FakeTensors. Where TorchNeuron is importable such an op
    is defined through `torch_neuronx.nki_op`, as its docs say custom ops with NKI kernels
    are (torch/guides/how-to-work-with-nki): `torch.compile(backend="neuron")` then traces
    into the body and each kernel call becomes one node of the captured graph; `nki_op`
    registers the body itself as the fake, and the body serves every device. A body
    whose planning reads tensor data (MoE routing, attention masks, cache lengths) hands
    that part, when `tracing()`, to a `define_host_op` op: one opaque node. Without
    TorchNeuron nothing changes: a plain custom op with `fake`.
    """
    if impl is None:
        return functools.partial(
            define_op,
            name,
            fake=fake,
            backward=backward,
            setup_context=setup_context,
            validate=validate,
            kernels=kernels,
            mutates_args=mutates_args,
            examples=examples,
            traceable=traceable,
        )
    if not name.isidentifier():
        raise ValueError(f"name: expected a Python identifier; got {name!r}")
    if name in _REGISTRY or hasattr(getattr(torch.ops, NAMESPACE), name):
        raise ValueError(f"name: torch.ops.{NAMESPACE}.{name} is already defined")
    if (backward is None) != (setup_context is None):
        raise ValueError("backward and setup_context: expected both or neither")
    overrides = dict(kernels or {})
    unknown = set(overrides) - set(SUPPORTED_DEVICES)
    if unknown:
        raise ValueError(f"kernels: expected keys among {SUPPORTED_DEVICES}; got {sorted(unknown)}")

    qualname = f"{NAMESPACE}::{name}"
    nki_op = torchneuron_nki_op() if traceable else None
    if nki_op is not None:
        op = nki_op(qualname, _traced_body(name, impl, validate), mutates_args=tuple(mutates_args))
        for device, fn in overrides.items():
            op.register_kernel(device)(_policy_scope(name, _checked(validate, _dense(fn))))
        return _record(name, op, impl, fake, examples, backward, setup_context, validate,
                       tuple(mutates_args), traceable, via_nki_op=True)  # fmt: skip
    # Inferred from `impl` itself so string annotations resolve in its module.
    schema = strict_schema(torch.library.infer_schema(impl, mutates_args=tuple(mutates_args)))
    schema = _schema_with_policy(schema)
    op = torch.library.custom_op(
        qualname, _unsupported(name, impl), mutates_args=tuple(mutates_args), schema=schema
    )
    op.register_kernel("cpu")(
        _policy_scope(name, _checked(validate, _dense(overrides.get("cpu", impl))))
    )
    pu1 = _privateuse1_device()
    if pu1 is not None:
        neuron = _checked(validate, _dense(overrides.get("neuron", impl)))
        op.register_kernel(pu1)(_policy_scope(name, neuron))
    op.register_fake(_policy_scope(name, _checked(validate, _dense(fake))))
    return _record(name, op, impl, fake, examples, backward, setup_context, validate,
                   tuple(mutates_args), traceable, via_nki_op=False)  # fmt: skip


HOST_NAMESPACE = "nki_host"


def tracing(*values: Any) -> bool:
    """True when a tensor among `values` (nested in tuples / lists too) has no data: a
    FakeTensor or a functional wrapper, i.e. the op body is being traced by
    `torch.compile` or run as its own fake (what `nki_op` registers)."""
    from torch._subclasses.fake_tensor import is_fake
    from torch._subclasses.functional_tensor import FunctionalTensor

    for v in values:
        if isinstance(v, (tuple, list)) and tracing(*v):
            return True
        if isinstance(v, torch.Tensor) and (is_fake(v) or isinstance(v, FunctionalTensor)):
            return True
    return False


def define_host_op(
    name: str,
    impl: Callable[..., Any],
    *,
    fake: Callable[..., Any],
    validate: Callable[..., Any] | None = None,
    mutates_args: Sequence[str] = (),
) -> Any:
    """`torch.ops.nki_host.<name>`: a plain custom op (cpu and neuron kernels, `fake`,
    the keyword-only `bucket_policy`) for the part of a traceable op's body that plans
    on tensor data (masks, cache lengths, routing): the body calls it when `tracing()`,
    so under `torch.compile` that part is one opaque node of the captured graph. Not
    recorded in `registered_ops()` (the op it serves is)."""
    qualname = f"{HOST_NAMESPACE}::{name}"
    written = tuple(mutates_args)  # arguments the host op writes in place (a KV cache)
    schema = strict_schema(torch.library.infer_schema(impl, mutates_args=written))
    schema = _schema_with_policy(schema)
    op = torch.library.custom_op(
        qualname, _unsupported(name, impl), mutates_args=written, schema=schema
    )
    run = _policy_scope(name, _checked(validate, _dense(impl)))
    op.register_kernel("cpu")(run)
    pu1 = _privateuse1_device()
    if pu1 is not None:
        op.register_kernel(pu1)(run)
    op.register_fake(_policy_scope(name, _checked(validate, _dense(fake))))
    return op


def call_host_op(name: str, *args: Any, **kwargs: Any) -> Any:
    """`torch.ops.nki_host.<name>(*args, **kwargs)` under the bucket policy in effect now
    (passed by name: the node runs after tracing, outside this call's policy scope)."""
    from ..runtime.buckets import current_policy

    op = getattr(getattr(torch.ops, HOST_NAMESPACE), name)
    return op(*args, **kwargs, **{POLICY_ARG: current_policy().name()})


# Registrations live as long as the library object: module-level, like the ops themselves.
_FORWARD_AD_LIB = torch.library.Library(NAMESPACE, "IMPL")
# Autograd kernels an op module installs after `define_op` (the forward-AD guard below sits
# on the backends' autograd keys, above the alias key such a module replaces).
_AUTOGRAD_OVERRIDES: dict[str, Callable[..., Any]] = {}


def override_autograd(name: str, kernel: Callable[..., Any]) -> None:
    """Route `torch.ops.nki.<name>`'s autograd dispatch (behind the forward-AD guard) to
    `kernel(keyset, *args, **kwargs)` instead of the kernel custom_op registered."""
    _AUTOGRAD_OVERRIDES[name] = kernel


def route_recorded_calls(op: Any, name: str, train_name: str) -> None:
    """Make `torch.ops.nki.<name>` run as `torch.ops.nki.<train_name>` (same arguments,
    returning (output, what its backward saves)) whenever autograd records the call (grad
    enabled, an input requiring grad); any other call runs the plain op below autograd.
    Ops defined through torch_neuronx.nki_op keep their own autograd wiring."""
    lib = getattr(getattr(op, "custom_op", None), "_lib", None)
    if lib is None:
        return

    def recorded(keyset: Any, *args: Any, **kw: Any) -> Any:
        if torch.is_grad_enabled() and torch._C._any_requires_grad(*args):
            return getattr(torch.ops.nki, train_name)(*args, **kw)[0]
        with torch._C._AutoDispatchBelowAutograd():
            after = keyset & torch._C._after_autograd_keyset
            return getattr(torch.ops.nki, name).default.redispatch(after, *args, **kw)

    with warnings.catch_warnings():  # replacing custom_op's Autograd kernel is intended
        warnings.simplefilter("ignore", UserWarning)
        lib.impl(name, recorded, "Autograd", with_keyset=True)
    override_autograd(name, recorded)  # behind the forward-AD guard's keys


def _tangent_argument(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """The name of the first argument holding a tensor with a forward-mode tangent, if any."""
    from torch.autograd import forward_ad

    if forward_ad._current_level < 0:  # no dual level open: no tensor can carry a tangent
        return None
    schema = getattr(getattr(torch.ops, NAMESPACE), name).default._schema
    positional = [a.name for a in schema.arguments if not a.kwarg_only]
    named = [*zip(positional, args), *kwargs.items()]
    for arg_name, value in named:
        values = value if isinstance(value, (tuple, list)) else [value]
        for v in values:
            if isinstance(v, torch.Tensor) and forward_ad.unpack_dual(v).tangent is not None:
                return arg_name
    return None


def _refuse_forward_ad(name: str) -> None:
    """Make forward-mode AD through `torch.ops.nki.<name>` an error.

    `torch.library.custom_op`'s autograd kernel runs the op below autograd whenever no
    input requires grad, so a dual input (`torch.func.jvp`, `torch.autograd.forward_ad`)
    would come out with no tangent: a silent zero derivative. No op here has a forward-mode
    formula, so a kernel registered for the backends' own autograd keys (which take
    precedence over the alias `Autograd` key custom_op registers under) raises when an
    argument carries a tangent and otherwise hands the call to that autograd kernel."""
    qualname = f"{NAMESPACE}::{name}"
    keys = ["AutogradCPU"]
    if _privateuse1_device() is not None:
        keys.append("AutogradPrivateUse1")
    for key in keys:
        autograd_kernel = torch.library.get_kernel(qualname, key)

        def guarded(keyset: Any, *args: Any, _kernel: Any = autograd_kernel, **kwargs: Any) -> Any:
            arg_name = _tangent_argument(name, args, kwargs)
            if arg_name is not None:
                raise RuntimeError(
                    f"torch.ops.{NAMESPACE}.{name}: forward-mode AD (torch.func.jvp, "
                    f"torch.autograd.forward_ad) is not supported; argument {arg_name!r} "
                    "carries a tangent. Use reverse mode (loss.backward() or "
                    "torch.autograd.grad) instead"
                )
            override = _AUTOGRAD_OVERRIDES.get(name)
            if override is not None:
                return override(keyset, *args, **kwargs)
            return _kernel.call_boxed(keyset, *args, **kwargs)

        _FORWARD_AD_LIB.impl(name, guarded, key, with_keyset=True)


def _record(
    name: str,
    op: Any,
    impl: Callable[..., Any],
    fake: Callable[..., Any],
    examples: Callable[[], Iterable[Example]] | None,
    backward: Callable[..., Any] | None,
    setup_context: Callable[..., Any] | None,
    validate: Callable[..., Any] | None,
    mutates_args: tuple[str, ...],
    traceable: bool,
    via_nki_op: bool,
) -> NkiOp:
    """Register the autograd formula and record the op in `registered_ops()`."""
    if backward is not None and setup_context is not None:
        grad, setup = _policy_autograd(name, backward, setup_context)
        op.register_autograd(grad, setup_context=setup)
    _refuse_forward_ad(name)
    entry = NkiOp(
        name, op, impl, fake, examples, differentiable=backward is not None,
        via_nki_op=via_nki_op, traceable=traceable, validate=validate, backward=backward,
        setup_context=setup_context, mutates_args=mutates_args,
    )  # fmt: skip
    _REGISTRY[name] = entry
    return entry


__all__ = [
    "HOST_NAMESPACE",
    "NAMESPACE",
    "POLICY_ARG",
    "SUPPORTED_DEVICES",
    "Example",
    "NkiOp",
    "call_host_op",
    "define_host_op",
    "define_op",
    "registered_ops",
    "torchneuron_nki_op",
    "tracing",
]
