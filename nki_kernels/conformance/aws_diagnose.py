"""Why an AWS MX case is wrong: re-runs under the interpreter's compatibility settings.

nki-library's MX goldens (commit d2ad3a57) compute the OCP sample algorithm's block
scale, which NKI 0.5 doubled ("a block scale two times larger", NKI 0.5 release notes);
the interpreter follows NKI 0.6. Some goldens also expect zeros in scale slots no
instruction writes. A wrong case whose trace has a `quantize_mx` is re-run from copies
of its inputs under `settings(mx_scale="pre-0.5")` and / or
`settings(fresh_memory="zero")`; the first combination that matches names the cause.
The case stays `wrong` (its reason starts with "wrong"): checked, not a pass.
"""

from __future__ import annotations

from typing import Any

COPY_LIMIT = 64 << 20  # bytes of inputs a wrong case may be re-run with

# (settings, the reason the case gives when those settings make it match)
ATTEMPTS: tuple[tuple[dict[str, str], str], ...] = (
    ({"mx_scale": "pre-0.5"}, "wrong under NKI 0.6; matches the pre-0.5 scale"),
    (
        {"fresh_memory": "zero"},
        "wrong: the golden expects zeros in memory no instruction wrote "
        "(matches with fresh memory zero-filled)",
    ),
    (
        {"mx_scale": "pre-0.5", "fresh_memory": "zero"},
        "wrong under NKI 0.6; matches the pre-0.5 scale, with zeros in memory no instruction wrote",
    ),
)
PRE_05 = "matches the pre-0.5 scale"  # how the report recognises the pre-0.5 cases


def mx_wrong_reason(launcher: Any, inputs: dict[str, Any], target: str, val: Any) -> str | None:
    """The reason of the first attempt under which the case matches, or None."""
    from ..interp.launch import run_call, settings
    from .aws_tests import check_outputs

    for extra, reason in ATTEMPTS:
        fresh = {k: v.copy() if hasattr(v, "copy") else v for k, v in inputs.items()}
        with settings(mx_scale=extra.get("mx_scale"), fresh_memory=extra.get("fresh_memory")):
            res = run_call(launcher, (), fresh, target=target)
        try:
            check_outputs(res.outputs, val, rank=0)
        except AssertionError:
            continue
        return reason
    return None
