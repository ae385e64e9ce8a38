"""The cost ledger: what a model's training step and serving step cost, per layer and per
dollar, on Trainium (ours vs TorchNeuron's native path, modeled) beside a GPU (measured).

`ledger.build(model, step, target, lnc)` prices every op of one step once (committed
op-level rows, then a cache, then the cost model) for `nki-kernels ledger` and
`nki-kernels bench --model`; `report` prints it; `prices` holds instances, prices and
payback arithmetic; `gpu` reads the measured GPU rows.
"""
