"""Offline autotuner: Optuna studies over kernel configs per (op, target, bucket, dtype).

See `docs/readme/autotune.md`. Modules: `space` (config search space -> Optuna
parameters), `study` (the driver), `measure` (cost model / hardware), `gate` (correctness
gate), `storage` (SQLite / RDB URL / journal), `export` (best configs -> the config
store), `buckets_opt` (bucket-boundary optimizer), `families` (the tunable ops), `cli`.
"""
