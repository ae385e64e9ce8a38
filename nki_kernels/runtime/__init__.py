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
    current_policy,
    parse_policy,
    set_bucket_policy,
)
from .config_store import (
    ConfigDecision,
    ConfigFallbackWarning,
    ConfigStore,
    InvalidEntryWarning,
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
    "ConfigDecision",
    "ConfigFallbackWarning",
    "ConfigStore",
    "ExplicitBuckets",
    "GeometricThenLinear",
    "InvalidEntryWarning",
    "KernelCache",
    "Provenance",
    "StaleConfigWarning",
    "bucket",
    "bucket_id",
    "current_policy",
    "default_store",
    "kernel_source_hash",
    "launch",
    "lookup_config",
    "pad_dim",
    "pad_to_bucket",
    "parse_policy",
    "problem_key",
    "set_bucket_policy",
    "set_config_dir",
    "unpad",
]
