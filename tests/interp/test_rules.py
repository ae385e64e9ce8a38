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
