"""Hugging Face generate() on a patched model runs decode through the streamed decode
kernel: one launch of `decode_stream_fwd` per decode step and layer for the whole batch
(not one program per (sequence, KV head)), with the unpatched model's tokens."""

from __future__ import annotations

import pytest
import torch

import nki_kernels
from nki_kernels.attention import decode_host
from nki_kernels.attention.decode_stream import decode_stream_fwd

transformers = pytest.importorskip("transformers")
from nki_kernels.parity.models import tiny_model  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)


def test_generate_launches_the_streamed_decode_kernel_once_per_step_and_layer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = tiny_model("llama")
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 128, (3, 9), generator=g)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, :3] = 0  # left padding: ragged cache lengths
    ids[1, :3] = 0
    kw = {"max_new_tokens": 5, "do_sample": False, "pad_token_id": 0}
    ref = model.generate(input_ids=ids, attention_mask=mask, **kw)
    kernels: list[str] = []
    real = decode_host.launch

    def counting(kernel, *args, **kwargs):  # type: ignore[no-untyped-def]
        kernels.append(kernel.__name__)
        return real(kernel, *args, **kwargs)

    monkeypatch.setattr(decode_host, "launch", counting)
    nki_kernels.patch(model)
    out = model.generate(input_ids=ids, attention_mask=mask, **kw)
    assert torch.equal(out, ref)
    layers = model.config.num_hidden_layers
    assert kernels == [decode_stream_fwd.__name__] * (layers * 4), kernels  # 4 decode steps
