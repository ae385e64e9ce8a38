"""The rule table itself: every rule the interpreter raises is documented in errors.RULES,
every documented rule is raised somewhere and has a negative test, and errors carry the
rule's name."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import nki_kernels.interp as interp
from nki_kernels.interp import RULES, MemoryPlanError, NkiValidationError, nisa, nl, run

PACKAGE = Path(interp.__file__).parent
TESTS = Path(__file__).parent
# fail("RULE", ...) / MemoryPlanError("RULE", ...), possibly with the id on the next line
RAISED = re.compile(r"(?:fail|Error)\(\s*\"([A-Z][A-Z0-9_]*)\"")


def _raised_rules() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.glob("*.py")):
        for rule in RAISED.findall(path.read_text()):
            found.setdefault(rule, set()).add(path.name)
    return found


def _tested_rules() -> set[str]:
    text = "\n".join(
        p.read_text() for p in TESTS.glob("test_*.py") if p.name != Path(__file__).name
    )
    return {rule for rule in RULES if re.search(rf"[\"']{rule}[\"']", text)}


def test_every_raised_rule_is_documented():
    undocumented = {r: sorted(f) for r, f in _raised_rules().items() if r not in RULES}
    assert not undocumented, f"rules raised but missing from errors.RULES: {undocumented}"


def test_every_documented_rule_is_raised_somewhere():
    assert set(RULES) <= set(_raised_rules()), set(RULES) - set(_raised_rules())


def test_every_rule_has_a_negative_test():
    missing = sorted(set(RULES) - _tested_rules())
    assert not missing, f"rules without a test asserting them: {missing}"


def test_every_rule_is_in_the_readme_table():
    doc = (TESTS.parent.parent / "docs" / "readme" / "interpreter.md").read_text()
    rows = dict(re.findall(r"^\| `([A-Z0-9_]+)` \| (.+?) \|$", doc, flags=re.M))
    missing = sorted(set(RULES) - set(rows))
    assert not missing, f"add these rules to the table in docs/readme/interpreter.md: {missing}"
    stale = sorted(r for r in rows if r in RULES and rows[r] != RULES[r])
    assert not stale, f"update their description in docs/readme/interpreter.md: {stale}"


def test_rule_descriptions_are_sentences():
    for rule, text in RULES.items():
        assert re.fullmatch(r"[A-Z][A-Z0-9_]*", rule)
        assert len(text) > 15 and not text.endswith("."), rule


def test_errors_carry_the_rule_and_name_it_in_the_message():
    err = NkiValidationError("TC1", "partition dim 256 exceeds 128")
    assert err.rule == "TC1" and str(err) == "partition dim 256 exceeds 128 (rule TC1)"
    assert issubclass(MemoryPlanError, NkiValidationError)
    assert nisa.NkiValidationError is NkiValidationError


def test_too_many_positional_arguments_is_a_kwarg_error():
    def kernel():
        t = nl.ndarray((2, 2), nl.float32)
        nisa.memset(t, 0.0, nisa.engine.vector, "name", "extra")

    with pytest.raises(NkiValidationError) as e:
        run(kernel)
    assert e.value.rule == "KWARG" and "takes 4 arguments" in str(e.value)


def test_validation_errors_are_not_numpy_tracebacks():
    """Bad operands fail with the interpreter's error before any NumPy code runs."""

    def kernel(x):
        t = nl.ndarray((4, 4), nl.float32)
        nisa.tensor_tensor(dst=t, data1=x, data2=t, op=nl.add)

    with pytest.raises(NkiValidationError) as e:
        run(kernel, np.zeros((4, 4), np.float32))
    assert e.value.rule == "BUF" and "data1 must be in SBUF or PSUM" in str(e.value)


def _s(shape=(8, 4), dtype=nl.float32, buffer=nl.sbuf):
    return nl.ndarray(shape, dtype, buffer=buffer)


def _hbm(shape=(8, 4), dtype=nl.float32):
    return nl.ndarray(shape, dtype, buffer=nl.hbm)


# Malformed arguments: each fails with the rule and a message naming the argument and the
# value received, never with a NumPy / Python error from inside the interpreter.
BAD_ARGUMENTS = [
    ("DTYPE", lambda: _s(dtype=np.float64), "dtype: expected an NKI dtype", "float64"),
    ("DTYPE", lambda: _s(dtype="float64"), "dtype: expected an NKI dtype", "'float64'"),
    ("DTYPE", lambda: nl.zeros((8, 4), np.int64), "dtype: expected an NKI dtype", "int64"),
    ("DTYPE", lambda: _s().view(np.float64), "view(dtype): expected", "float64"),
    ("DTYPE", lambda: nl.shared_constant(np.zeros(3)), "shared_constant dtype", "float64"),
    ("ARG", lambda: nl.full((8, 4), "x", nl.float32), "fill value: expected a number", "'x'"),
    ("ARG", lambda: _s().slice(1, "a", 3), "slice: start must be an int", "'a'"),
    ("ARG", lambda: _s().expand_dim("a"), "expand_dim: dim must be an int", "'a'"),
    ("ARG", lambda: nl.load([1, 2]), "nl.load: src must be an NKI tensor", "list"),
    ("ARG", lambda: nl.copy("x"), "nl.copy: x must be an NKI tensor", "str"),
    ("ARG", lambda: nl.store(_hbm(), 5), "nl.store: value must be an NKI tensor", "int"),
    ("ARG", lambda: nl.sum(_s(), axis="x"), "nl.sum: axis must be an int or a tuple", "'x'"),
    (
        "ARG",
        lambda: nisa.tensor_reduce(_s((8, 1)), nl.add, _s(), axis="1"),
        "tensor_reduce: axis must be an int or a tuple of ints",
        "'1'",
    ),
    (
        "ARG",
        lambda: nisa.tensor_reduce(_s((8, 1)), nl.add, _s(), axis=["a"]),
        "tensor_reduce: axis must be an int or a tuple of ints",
        "['a']",
    ),
    (
        "ARG",
        lambda: nisa.tensor_reduce(_s((8, 1)), nl.add, _s(), axis=1, negate="yes"),
        "tensor_reduce: negate must be True or False",
        "'yes'",
    ),
    (
        "ARG",
        lambda: nisa.tensor_scalar(_s(), _s(), nl.add, 1.0, reverse0="no"),
        "tensor_scalar: reverse0 must be True or False",
        "'no'",
    ),
    (
        "ARG",
        lambda: nisa.nc_matmul(_s(buffer=nl.psum), _s((16, 8)), _s((16, 4)), is_transpose=1),
        "nc_matmul: is_transpose must be True or False",
        "1",
    ),
    (
        "ARG",
        lambda: nisa.dma_transpose(_s((4, 8), nl.bfloat16), _hbm((8, 4), nl.bfloat16), axes=5),
        "dma_transpose: axes must be a tuple of ints",
        "5",
    ),
    (
        "ARG",
        lambda: nisa.iota(_s(dtype=nl.int32), [[1, 4]], offset=2**40),
        "iota: offset=1099511627776 is outside",
        "2147483647",
    ),
    ("ARG", lambda: nisa.iota(_s(dtype=nl.int32), "abc"), "iota: pattern must be", "'abc'"),
    (
        "OP",
        lambda: nisa.affine_select(_s(), [[1, 4]], 0, _s(), 0.0, cmp_op="equal"),
        "affine_select: cmp_op must be an nl op token",
        "'equal'",
    ),
]


@pytest.mark.parametrize(
    ("rule", "call", "names", "received"), BAD_ARGUMENTS, ids=[c[2] for c in BAD_ARGUMENTS]
)
def test_bad_arguments_name_the_argument_and_the_value(rule, call, names, received):
    def kernel():
        call()

    with pytest.raises(NkiValidationError) as e:
        run(kernel)
    assert e.value.rule == rule, str(e.value)
    assert names in str(e.value) and received in str(e.value), str(e.value)


def test_memset_of_an_int_beyond_int64_saturates_like_any_int_store():
    def kernel():
        t = _s(dtype=nl.int8)
        nisa.memset(t, 10**20)
        o = nl.ndarray((8, 4), nl.int8, buffer=nl.shared_hbm)
        nisa.dma_copy(o, t)
        return o

    assert (run(kernel).outputs == 127).all()
