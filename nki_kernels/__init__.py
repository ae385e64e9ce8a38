"""nki-kernels: hand-written NKI kernels for AWS Trainium as PyTorch custom ops.

Importing the package registers every op (`torch.ops.nki.rms_norm`, `layer_norm`,
`add_rms_norm`, `flash_attention`, `moe_mlp`, `moe_route`, ...) for the `cpu` and
`neuron` devices. The Python entry points are re-exported here; the modules are in
`nki_kernels.nn`; `patch(model)` / `unpatch(model)` put them into existing models
(`nki_kernels.integrations`).
"""

from __future__ import annotations

__version__ = "0.1.0"

from . import ops as _ops

_ops.load_all()

from . import nn  # noqa: E402
from .integrations import patch, unpatch  # noqa: E402
from .ops.attention import (  # noqa: E402
    flash_attention,
    flash_attention_varlen,
    flex_attention,
    sdpa,
)
from .ops.decode import decode_attention  # noqa: E402
from .runtime.buckets import set_bucket_policy  # noqa: E402
from .runtime.explain import explain  # noqa: E402

__all__ = [
    "__version__",
    "decode_attention",
    "explain",
    "flash_attention",
    "flash_attention_varlen",
    "flex_attention",
    "nn",
    "patch",
    "sdpa",
    "set_bucket_policy",
    "unpatch",
]
