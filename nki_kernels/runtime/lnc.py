"""The logical-core count (LNC) every op launches its kernels at, decided once per process.

What the Neuron documentation says (aws-neuron-sdk @ 81ce03ae):

* `about-neuron/arch/neuron-features/logical-neuroncore-config.rst`: "LNC can only be set
  to 1 or 2"; the Neuron Runtime reads it from `NEURON_LOGICAL_NC_CONFIG`; "On Trn2 ...
  With LNC=2 (default)"; "LNC applies only to Trn2 and Trn3 instances".
* `nki/api/nki/__init__.py` (`nki.jit`): "The LNC value must match the
  NEURON_LOGICAL_NC_CONFIG environment variable set for the Neuron Runtime. Mismatching
  the two will cause a runtime error."
* Trn3: no page states its default. `trainium3.rst` says LNC works there "Similar to
  Trainium2" and the trn3 serving tutorial (`trn3-gpt-oss-120b-tutorial.rst`) runs
  LNC=2; we assume 2 (confidence M). Trn1 has no LNC setting: 1.

The rule (`runtime_lnc`):

1. `NEURON_LOGICAL_NC_CONFIG`, when set (read once, here -- the edge; `set_runtime_lnc`
   overrides it at run time, e.g. in tests);
2. else, when this process drives a real Neuron device (TorchNeuron), the target's
   documented default (`DEFAULT_LNC`);
3. else 1: without a Neuron Runtime the interpreter runs each kernel as one logical
   core. Set the variable (or call `set_runtime_lnc(2)`) to run every op at LNC 2 on CPU
   or the emulated device exactly as a default trn2 would.

Every launch, kernel-cache key and tuned-config key carries the LNC it resolved to.
"""

from __future__ import annotations

import os
import threading

from ..targets import Target, get_target

LNC_ENV_VAR = "NEURON_LOGICAL_NC_CONFIG"
SUPPORTED_LNC = (1, 2)

# The documented default per target (see the module docstring for the sources).
DEFAULT_LNC = {"trn1": 1, "trn2": 2, "trn3": 2}

_lock = threading.Lock()
_state: dict[str, int | bool | None] = {"read": False, "value": None}


def check_lnc(value: object, where: str = "lnc") -> int:
    """`value` as an LNC (1 or 2); ValueError naming `where` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in SUPPORTED_LNC:
        raise ValueError(f"{where}: expected 1 or 2; got {value!r}")
    return value


def _parse_env(raw: str) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        raise ValueError(f"{LNC_ENV_VAR}: expected 1 or 2; got {raw!r}") from None
    return check_lnc(value, LNC_ENV_VAR)


def configured_lnc() -> int | None:
    """The LNC set for this process (environment or `set_runtime_lnc`), or None."""
    with _lock:
        if not _state["read"]:
            raw = os.environ.get(LNC_ENV_VAR)
            _state["value"] = _parse_env(raw) if raw not in (None, "") else None
            _state["read"] = True
        value = _state["value"]
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def set_runtime_lnc(value: int | None) -> None:
    """Override the LNC for this process; None goes back to reading the environment."""
    with _lock:
        if value is None:
            _state.update(read=False, value=None)
        else:
            _state.update(read=True, value=check_lnc(value))


def default_lnc(target: str | Target | None = None) -> int:
    """The documented default LNC of `target` on a real device."""
    return DEFAULT_LNC.get(get_target(target).name, 1)


def runtime_lnc(target: str | Target | None = None) -> int:
    """The LNC every op launches at in this process (see the module docstring)."""
    value = configured_lnc()
    if value is not None:
        return value
    from .neuron_device import is_real_neuron

    return default_lnc(target) if is_real_neuron() else 1


__all__ = [
    "DEFAULT_LNC",
    "LNC_ENV_VAR",
    "SUPPORTED_LNC",
    "check_lnc",
    "configured_lnc",
    "default_lnc",
    "runtime_lnc",
    "set_runtime_lnc",
]
