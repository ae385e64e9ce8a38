"""Op tokens: `nl.add`, `nl.exp`, ... are both `op=` arguments of ISA calls and callables.

Each token knows its kind (binary ALU, bitvec, unary ALU, activation function) and its
fp32 NumPy semantics. Calling a token as a function (`nl.add(x, y)`) is the experimental
`nl` compute layer; `language.py` installs that behaviour.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

_erf = np.vectorize(math.erf, otypes=[np.float64])
# gelu_apprx_sigmoid(x) = x * sigmoid(1.702 x): the usual sigmoid approximation of GELU
_GELU_SIGMOID_K = np.float32(1.702)
PRELU_DEFAULT_SLOPE = 0.0


def _erf32(x: np.ndarray) -> np.ndarray:
    return _erf(x.astype(np.float64)).astype(np.float32)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-x))).astype(np.float32)


def _gelu(x: np.ndarray) -> np.ndarray:
    return (0.5 * x * (1.0 + _erf32(x / np.float32(math.sqrt(2.0))))).astype(np.float32)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    c = np.float32(math.sqrt(2.0 / math.pi))
    return (0.5 * x * (1.0 + np.tanh(c * (x + np.float32(0.044715) * x**3)))).astype(np.float32)


def _gelu_dx(x: np.ndarray) -> np.ndarray:
    pdf = np.exp(-0.5 * x * x) / np.float32(math.sqrt(2.0 * math.pi))
    cdf = 0.5 * (1.0 + _erf32(x / np.float32(math.sqrt(2.0))))
    return (cdf + x * pdf).astype(np.float32)


def _gelu_sigmoid(x: np.ndarray) -> np.ndarray:
    return (x * _sigmoid(_GELU_SIGMOID_K * x)).astype(np.float32)


def _gelu_sigmoid_dx(x: np.ndarray) -> np.ndarray:
    s = _sigmoid(_GELU_SIGMOID_K * x)
    return (s + _GELU_SIGMOID_K * x * s * (1.0 - s)).astype(np.float32)


def _prelu(x: np.ndarray) -> np.ndarray:
    # relu_param (the negative slope) is an operand of nisa.activate2 only; the
    # interpreter's activation() has no such operand and uses its documented default, 0.0
    return np.where(x > 0, x, np.float32(PRELU_DEFAULT_SLOPE) * x).astype(np.float32)


def _silu_dx(x: np.ndarray) -> np.ndarray:
    s = _sigmoid(x)
    return (s * (1.0 + x * (1.0 - s))).astype(np.float32)


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(np.float32(0.0), x).astype(np.float32)


def _cmp(f: Callable[[Any, Any], Any]) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    return lambda a, b: f(a, b).astype(np.float32)


def _logical(f: Callable[[Any, Any], Any]) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    return lambda a, b: f(a != 0, b != 0).astype(np.float32)


class Op:
    """An NKI op token.

    kind: "binary" (arithmetic ALU), "bitvec" (integer bit ops), "unary" (ALU unary and
    activation function), "bypass". `activation` says whether ScalarE `activation()`
    accepts it; `reduce` whether it is a legal reduce op.
    """

    __slots__ = (
        "__signature__",
        "_call",
        "activation",
        "fn",
        "kind",
        "name",
        "reduce",
        "version",
    )

    def __init__(
        self,
        name: str,
        kind: str,
        fn: Callable[..., np.ndarray] | None,
        activation: bool = False,
        reduce: bool = False,
        version: int = 2,
    ) -> None:
        self.name = name
        self.kind = kind
        self.fn = fn
        self.activation = activation
        self.reduce = reduce
        self.version = version
        self._call: Callable[..., Any] | None = None

    def __repr__(self) -> str:
        return f"nl.{self.name}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The experimental nl compute call (`nl.add(x, y)`, `nl.exp(x)`, ...)."""
        if self._call is None:
            raise TypeError(f"nl.{self.name} is an op token only and cannot be called")
        return self._call(*args, **kwargs)

    @property
    def is_unary(self) -> bool:
        """Whether the token is a unary ALU op or activation function."""
        return self.kind == "unary"

    @property
    def is_bitvec(self) -> bool:
        """Whether the token is a bitvec (integer bit-pattern) operator."""
        return self.kind == "bitvec"


_B = "binary"
_U = "unary"

TOKENS: dict[str, Op] = {}


def _def(name: str, kind: str, fn: Any, **kw: Any) -> Op:
    op = Op(name, kind, fn, **kw)
    TOKENS[name] = op
    return op


# ---- binary arithmetic ALU ops (fp32) ---------------------------------------------
add = _def("add", _B, np.add, reduce=True)
subtract = _def("subtract", _B, np.subtract, reduce=True)
multiply = _def("multiply", _B, np.multiply, reduce=True)
maximum = _def("maximum", _B, np.maximum, reduce=True)
minimum = _def("minimum", _B, np.minimum, reduce=True)
divide = _def("divide", _B, np.divide)
power = _def("power", _B, np.power)
equal = _def("equal", _B, _cmp(np.equal))
not_equal = _def("not_equal", _B, _cmp(np.not_equal))
greater = _def("greater", _B, _cmp(np.greater))
greater_equal = _def("greater_equal", _B, _cmp(np.greater_equal))
less = _def("less", _B, _cmp(np.less))
less_equal = _def("less_equal", _B, _cmp(np.less_equal))
logical_and = _def("logical_and", _B, _logical(np.logical_and), reduce=True)
logical_or = _def("logical_or", _B, _logical(np.logical_or), reduce=True)
logical_xor = _def("logical_xor", _B, _logical(np.logical_xor), reduce=True)
abs_max = _def("abs_max", _B, lambda a, b: np.maximum(np.abs(a), np.abs(b)), version=4)
abs_min = _def("abs_min", _B, lambda a, b: np.minimum(np.abs(a), np.abs(b)), version=4)
# average is a tensor_partition_reduce op only
average = _def("average", _B, np.add)

# ---- bitvec ops (integers, bit patterns) --------------------------------------------
bitwise_and = _def("bitwise_and", "bitvec", np.bitwise_and, reduce=True)
bitwise_or = _def("bitwise_or", "bitvec", np.bitwise_or, reduce=True)
bitwise_xor = _def("bitwise_xor", "bitvec", np.bitwise_xor, reduce=True)
left_shift = _def("left_shift", "bitvec", np.left_shift)
right_shift = _def(
    "right_shift",
    "bitvec",
    lambda a, b: (a.astype(np.uint64) % (1 << 32) >> b.astype(np.uint64)).astype(np.int64),
)
invert = _def("invert", "bitvec", np.invert)

# ---- unary: ALU unaries and ScalarE activation functions ------------------------
_f32 = np.float32
copy = _def("copy", _U, lambda x: x, activation=True)
identity = copy
square = _def("square", _U, np.square, activation=True)
relu = _def("relu", _U, lambda x: np.maximum(x, _f32(0.0)), activation=True)
rsqrt = _def("rsqrt", _U, lambda x: (_f32(1.0) / np.sqrt(x)).astype(_f32), activation=True)
reciprocal = _def("reciprocal", _U, lambda x: (_f32(1.0) / x).astype(_f32), activation=True)
abs = _def("abs", _U, np.abs, activation=True)
negative = _def("negative", _U, np.negative)
exp = _def("exp", _U, np.exp, activation=True)
log = _def("log", _U, np.log, activation=True)
sqrt = _def("sqrt", _U, np.sqrt, activation=True)
tanh = _def("tanh", _U, np.tanh, activation=True)
sigmoid = _def("sigmoid", _U, _sigmoid, activation=True)
silu = _def("silu", _U, lambda x: (x * _sigmoid(x)).astype(_f32), activation=True)
silu_dx = _def("silu_dx", _U, _silu_dx, activation=True)
gelu = _def("gelu", _U, _gelu, activation=True)
gelu_dx = _def("gelu_dx", _U, _gelu_dx, activation=True)
gelu_apprx_tanh = _def("gelu_apprx_tanh", _U, _gelu_tanh, activation=True)
gelu_apprx_sigmoid = _def("gelu_apprx_sigmoid", _U, _gelu_sigmoid, activation=True)
gelu_apprx_sigmoid_dx = _def("gelu_apprx_sigmoid_dx", _U, _gelu_sigmoid_dx, activation=True)
prelu = _def("prelu", _U, _prelu, activation=True)
softplus = _def("softplus", _U, _softplus, activation=True)
mish = _def("mish", _U, lambda x: (x * np.tanh(_softplus(x))).astype(_f32), activation=True)
erf = _def("erf", _U, _erf32, activation=True)
erf_dx = _def(
    "erf_dx",
    _U,
    lambda x: (_f32(2.0 / math.sqrt(math.pi)) * np.exp(-x * x)).astype(_f32),
    activation=True,
)
sin = _def("sin", _U, np.sin, activation=True)
cos = _def("cos", _U, np.cos)
arctan = _def("arctan", _U, np.arctan, activation=True)
sign = _def("sign", _U, np.sign, activation=True)
floor = _def("floor", _U, np.floor)
ceil = _def("ceil", _U, np.ceil)

bypass = Op("bypass", "bypass", None)
TOKENS["bypass"] = bypass

# Docstrings write nl.max / nl.min where the tokens are maximum / minimum: accept both.
# (As callables they are the nl.max / nl.min reductions.)
max_ = _def("max", _B, np.maximum, reduce=True)
min_ = _def("min", _B, np.minimum, reduce=True)
