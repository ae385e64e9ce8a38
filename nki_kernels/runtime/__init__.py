"""Runtime: shape buckets, padding, config lookup, the compiled-kernel cache and launch.

An op's implementation runs, in order: `bucket`/`pad_to_bucket` (static shapes) ->
`lookup_config` (tuned config from the store, or the heuristic default) -> `launch`
(kernel cache, then the interpreter, the official simulator or TorchNeuron) -> `unpad`.
"""

from __future__ import annotations

from .buckets import (
    DEFAULT_POLICY,
    BucketOverflow,
    BucketPolicy,
    ExplicitBuckets,
    GeometricThenLinear,
    bucket,
    bucket_id,
)
from .config_store import (
    ConfigFallbackWarning,
    ConfigStore,
    Provenance,
    StaleConfigWarning,
    default_store,
    lookup_config,
    problem_key,
    set_config_dir,
)
from .kernel_cache import KERNEL_CACHE, KernelCache, kernel_source_hash
from .launch import launch
from .padding import pad_dim, pad_to_bucket, unpad

__all__ = [
    "DEFAULT_POLICY",
    "KERNEL_CACHE",
    "BucketOverflow",
    "BucketPolicy",
    "ConfigFallbackWarning",
    "ConfigStore",
    "ExplicitBuckets",
    "GeometricThenLinear",
    "KernelCache",
    "Provenance",
    "StaleConfigWarning",
    "bucket",
    "bucket_id",
    "default_store",
    "kernel_source_hash",
    "launch",
    "lookup_config",
    "pad_dim",
    "pad_to_bucket",
    "problem_key",
    "set_config_dir",
    "unpad",
]
