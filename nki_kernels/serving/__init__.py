"""Serving attention: cache writes, segmented (prefix / chunked / speculative) attention
over a paged or contiguous KV cache, FP8 KV, and a vLLM-Neuron-shaped functional API.

Kernels beside their references: `segmented.py` (write, then attend, in one launch),
`decode_step.py` (write, then the streamed decode body of `attention/decode_stream.py`;
a mixed step adds the segmented body, same launch), `cache_write.py` (the write alone),
`reference.py` (float64 PyTorch), `host.py` (the step planner and launches),
`decode_step_host.py` (which sequences take the decode body, its plan and launch),
`functional.py` (the `vllm_neuron.functional`-shaped names), `simloop.py` (tiny decoders
driven by a simulated scheduler, checked step by step). The torch ops are registered in
`nki_kernels/ops/serving.py` (and attention sinks on the training kernels in
`nki_kernels/ops/sinks.py`).
"""
