"""Routers patched on several threads at once (models loaded in parallel) all get the
one NKI subclass of their class, as when patched one after the other."""

from __future__ import annotations

import threading
import time

from torch import nn

from nki_kernels.integrations import hf


class _SlowDict(dict):
    """A dict whose lookups yield the GIL (an unlocked check-then-create from several
    threads then makes one subclass per thread, instead of rarely) and that counts the
    subclasses stored."""

    stores = 0

    def __setitem__(self, key, value) -> None:  # type: ignore[no-untyped-def]
        self.stores += 1
        super().__setitem__(key, value)

    def get(self, key, default=None):  # type: ignore[no-untyped-def]
        found = super().get(key, default)
        time.sleep(1e-3)
        return found

    def __contains__(self, key: object) -> bool:
        found = super().__contains__(key)
        time.sleep(1e-3)
        return found


class GptOssTopKRouter(nn.Module):
    """Stands for the model's router class (only its type matters here)."""


def test_routers_patched_on_threads_share_one_subclass(monkeypatch) -> None:
    classes = _SlowDict()
    monkeypatch.setattr(hf, "_ROUTER_CLASSES", classes)
    routers = [GptOssTopKRouter() for _ in range(6)]
    start = threading.Barrier(len(routers))
    got: list[type] = []

    def work(r: nn.Module) -> None:
        start.wait()
        got.append(type(hf._nki_router(r, "gpt_oss")))

    pool = [threading.Thread(target=work, args=(r,)) for r in routers]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert classes.stores == 1  # one subclass made, not one per thread
    assert len(got) == len(routers) and len(set(got)) == 1
    (sub,) = set(got)
    assert issubclass(sub, GptOssTopKRouter) and sub is hf._ROUTER_CLASSES[GptOssTopKRouter]
