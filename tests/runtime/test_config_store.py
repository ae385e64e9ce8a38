"""Config store: exact -> nearest compatible -> heuristic default; provenance; atomic writes."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from nki_kernels.kernel_config import InvalidConfig, KernelConfig
from nki_kernels.runtime import config_store as cs
from nki_kernels.runtime.config_store import (
    ConfigFallbackWarning,
    ConfigStore,
    Provenance,
    StaleConfigWarning,
    problem_key,
)
from nki_kernels.targets import Target

HASH = "0123456789abcdef"


@dataclasses.dataclass(frozen=True)
class Prob:
    rows: int
    hidden: int
    dtype: str


@dataclasses.dataclass(frozen=True)
class TileConfig(KernelConfig):
    op_name = "store_test_op"
    tile: int = 128

    @classmethod
    def heuristic(cls, problem: Any, target: Target) -> TileConfig:
        return cls(tile=64)

    @classmethod
    def search_space(cls, problem: Any, target: Target) -> dict[str, tuple[Any, ...]]:
        return {"tile": (64, 128, 256, 512)}

    def validate(self, problem: Any, target: Target) -> None:
        if self.tile > problem.rows:
            raise InvalidConfig(f"tile {self.tile} > rows {problem.rows}")


def prov(latency: float = 100.0, kernel_hash: str = HASH) -> Provenance:
    return Provenance(
        kernel_hash, "modeled (cost model v1, trn2)", latency, 150.0, 16, Provenance.now()
    )


def store(tmp_path: Path) -> ConfigStore:
    return ConfigStore([tmp_path / "user", tmp_path / "shipped"], tmp_path / "user")


def test_problem_key_is_canonical() -> None:
    assert problem_key(Prob(512, 4096, "bfloat16")) == "dtype=bfloat16,hidden=4096,rows=512"
    assert problem_key({"b": 1, "a": "x"}) == "a=x,b=1"
    with pytest.raises(TypeError, match="problem field 'rows': expected int, float or str"):
        problem_key({"rows": (1, 2)})


def test_exact_hit_with_provenance_round_trip(tmp_path: Path) -> None:
    s = store(tmp_path)
    p = prov()
    path = s.put("store_test_op", "trn2", Prob(512, 64, "float32"), TileConfig(256), p)
    assert path == tmp_path / "user" / "trn2" / "store_test_op.json"
    data = json.loads(path.read_text())
    assert data["format"] == 1 and data["op"] == "store_test_op" and data["target"] == "trn2"
    cfg, got = s.lookup("store_test_op", "trn2", Prob(512, 64, "float32"), kernel_hash=HASH)
    assert cfg == TileConfig(256) and got == p  # config class found from op_name


def test_nearest_compatible_bucket(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.put("store_test_op", "trn2", Prob(256, 64, "float32"), TileConfig(256), prov())
    s.put("store_test_op", "trn2", Prob(4096, 64, "float32"), TileConfig(512), prov())
    s.put("store_test_op", "trn2", Prob(1024, 64, "bfloat16"), TileConfig(128), prov())
    # 1024 rows: 4096 and 256 are both 2 octaves away -> the tie goes to the smaller
    # problem; the bfloat16 entry is incompatible (dtype differs) though only 0 octaves away
    cfg, p = s.lookup("store_test_op", "trn2", Prob(1024, 64, "float32"), kernel_hash=HASH)
    assert p is not None and cfg == TileConfig(256)
    # 2048 rows: 4096 is 1 octave away, 256 is 3
    cfg, _ = s.lookup("store_test_op", "trn2", Prob(2048, 64, "float32"), kernel_hash=HASH)
    assert cfg == TileConfig(512)
    # 300 rows: nearest is 256 -> tile 256 is valid for 300 rows
    cfg, _ = s.lookup("store_test_op", "trn2", Prob(300, 64, "float32"), kernel_hash=HASH)
    assert cfg == TileConfig(256)


def test_nearest_skips_configs_invalid_for_the_problem(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.put("store_test_op", "trn2", Prob(512, 64, "float32"), TileConfig(512), prov())
    s.put("store_test_op", "trn2", Prob(32, 64, "float32"), TileConfig(64), prov())
    # 128 rows: the 512 entry (2 octaves) has tile 512 > 128 rows: invalid -> the 32 entry
    cfg, _ = s.lookup("store_test_op", "trn2", Prob(128, 64, "float32"), kernel_hash=HASH)
    assert cfg == TileConfig(64)


def test_heuristic_default_is_reported_once_per_process_in_plain_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(cs.QUIET_FALLBACK_ENV_VAR, raising=False)
    s = store(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rows in (128, 256, 128):
            cfg, p = s.lookup("store_test_op", "trn2", Prob(rows, 64, "float32"))
            assert cfg == TileConfig(64) and p is None
        s.lookup("store_test_op", "trn3", Prob(128, 64, "float32"))
    fallbacks = [w for w in caught if issubclass(w.category, ConfigFallbackWarning)]
    assert len(fallbacks) == 1
    text = str(fallbacks[0].message)
    assert "store_test_op at this shape on trn2" in text and "results are the same" in text
    assert cs.QUIET_FALLBACK_ENV_VAR in text
    assert fallbacks[0].filename == __file__  # points at the caller, not into the package


def test_quiet_fallback_switch_silences_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cs.QUIET_FALLBACK_ENV_VAR, "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store(tmp_path).lookup("store_test_op", "trn2", Prob(128, 64, "float32"))
    assert not [w for w in caught if issubclass(w.category, ConfigFallbackWarning)]


def test_stale_kernel_hash_is_not_used_silently(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.put(
        "store_test_op", "trn2", Prob(512, 64, "float32"), TileConfig(256), prov(kernel_hash="old")
    )
    with pytest.warns(StaleConfigWarning, match="tuned for kernel source old"):
        with pytest.warns(ConfigFallbackWarning):
            cfg, p = s.lookup("store_test_op", "trn2", Prob(512, 64, "float32"), kernel_hash=HASH)
    assert cfg == TileConfig(64) and p is None


def test_user_dir_wins_over_shipped_and_stale_user_entry_falls_back(tmp_path: Path) -> None:
    s = store(tmp_path)
    problem = Prob(512, 64, "float32")
    s.put("store_test_op", "trn2", problem, TileConfig(128), prov(), directory=tmp_path / "shipped")
    s.put("store_test_op", "trn2", problem, TileConfig(256), prov())
    assert s.lookup("store_test_op", "trn2", problem, kernel_hash=HASH)[0] == TileConfig(256)
    s.put("store_test_op", "trn2", problem, TileConfig(512), prov(kernel_hash="old"))
    with pytest.warns(StaleConfigWarning):
        cfg, _ = s.lookup("store_test_op", "trn2", problem, kernel_hash=HASH)
    assert cfg == TileConfig(128)


def test_entries_that_do_not_load_are_reported(tmp_path: Path) -> None:
    s = store(tmp_path)
    path = s.put("store_test_op", "trn2", Prob(512, 64, "float32"), TileConfig(256), prov())
    data = json.loads(path.read_text())
    entry = data["entries"]["dtype=float32,hidden=64,rows=512"]
    entry["config"]["unknown_field"] = 1
    path.write_text(json.dumps(data))
    with pytest.warns(StaleConfigWarning, match="not a field of"):
        with pytest.warns(ConfigFallbackWarning):
            s.lookup("store_test_op", "trn2", Prob(512, 64, "float32"))


def test_put_merges_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    s = store(tmp_path)
    for rows in (128, 256, 512):
        s.put("store_test_op", "trn2", Prob(rows, 64, "float32"), TileConfig(64), prov(rows))
    d = tmp_path / "user" / "trn2"
    assert sorted(p.name for p in d.iterdir()) == ["store_test_op.json"]  # no lock file either
    entries = json.loads((d / "store_test_op.json").read_text())["entries"]
    assert [e["provenance"]["latency_ns"] for e in entries.values()] == [128.0, 256.0, 512.0]


def test_put_needs_a_directory() -> None:
    with pytest.raises(ValueError, match="no directory to write to"):
        ConfigStore([], None).put("store_test_op", "trn2", Prob(1, 1, "f"), TileConfig(), prov())


def test_config_dir_is_read_once_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cs, "_default", None)
    monkeypatch.setenv(cs.CONFIG_DIR_ENV_VAR, str(tmp_path))
    s = cs.default_store()
    assert s.write_dir == tmp_path and s.search_dirs == [tmp_path, cs.SHIPPED_DIR]
    monkeypatch.setenv(cs.CONFIG_DIR_ENV_VAR, str(tmp_path / "other"))
    assert cs.default_store() is s
    s2 = cs.set_config_dir(None)
    assert s2.search_dirs == [cs.SHIPPED_DIR] and s2.write_dir is None


def test_keys_carry_the_lnc_and_lnc1_configs_do_not_serve_lnc2(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.put("store_test_op", "trn2", Prob(512, 64, "float32"), TileConfig(256), prov())
    s.put("store_test_op", "trn2", Prob(512, 64, "float32"), TileConfig(128), prov(), lnc=2)
    path = tmp_path / "user" / "trn2" / "store_test_op.json"
    keys = sorted(json.loads(path.read_text())["entries"])
    assert keys == ["dtype=float32,hidden=64,lnc=2,rows=512", "dtype=float32,hidden=64,rows=512"]
    one, _ = s.lookup("store_test_op", "trn2", Prob(512, 64, "float32"), kernel_hash=HASH)
    two, _ = s.lookup("store_test_op", "trn2", Prob(512, 64, "float32"), kernel_hash=HASH, lnc=2)
    assert (one, two) == (TileConfig(256), TileConfig(128))
    # bfloat16 has an LNC-1 entry only: an LNC-2 lookup falls back to the default
    s.put("store_test_op", "trn2", Prob(512, 64, "bfloat16"), TileConfig(512), prov())
    with pytest.warns(ConfigFallbackWarning):
        cfg, p = s.lookup("store_test_op", "trn2", Prob(512, 64, "bfloat16"), lnc=2)
    assert p is None and cfg == TileConfig(64)
    with pytest.raises(ValueError, match="'lnc' is reserved"):
        problem_key(cs.lnc_items({"lnc": 2, "rows": 1}, 1))
