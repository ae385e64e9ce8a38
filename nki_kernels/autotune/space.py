"""A kernel config's search space as Optuna parameters.

`KernelConfig.search_space(problem, target)` gives candidate values per field. Here each
field becomes one Optuna parameter, stored under one of `ENCODINGS`:

- `values` (the default for new studies): every parameter holds the field's value, so a
  study (and optuna-dashboard) reads `chunk: 4096`. A field of three or more int
  candidates is an ordered int range: `IntDistribution(low, high, step)` when they are
  evenly spaced (exactly the candidates), else `IntDistribution(low, high, log=...)`
  (log for a geometric series such as 512, 1024, 2048) with `CandidateSampler` keeping
  every sample on a candidate. TPE models the order as it would an index;
- `index` (studies created before `values`): such a field is the index into its sorted
  candidates (`IntDistribution(0, n - 1)`), so the study reads `chunk: 2`;
- `categorical` (measured, not used by default): every field categorical over its values
  -- readable, but TPE then ignores the order (benchmarks/bench_autotune.py measures the
  cost).

Other fields are categorical over their values (str / int / float / bool / None) or over
candidate indices (tuples, enums) under every encoding. An existing study keeps the
encoding it was created with (`encoding_of`). The same encoding feeds `GridSampler`
(`grid()`), `enqueue_trial` (`encode`) and decoding (`decode`), so a config maps to exactly
one parameter dict and back.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.samplers import BaseSampler

from ..kernel_config import KernelConfig
from ..targets import Target

_PRIMITIVES = (str, int, float, bool, type(None))

# Spaces up to this many configs are searched exhaustively by default.
GRID_THRESHOLD = 64
ENCODINGS = ("values", "index", "categorical")


@dataclass(frozen=True)
class Param:
    """One config field as an Optuna parameter: its candidates and how they are encoded."""

    name: str
    choices: tuple[Any, ...]
    kind: str  # "ordinal" | "categorical" | "indexed"
    encoding: str = "values"

    @property
    def _by_value(self) -> bool:
        return self.kind == "categorical" or (self.kind == "ordinal" and self.encoding != "index")

    @property
    def snaps(self) -> bool:
        """True when the distribution is a range of ints wider than the candidates (the
        sampler must keep to the candidates, `CandidateSampler`)."""
        d = self.distribution()
        return isinstance(d, IntDistribution) and len(range(d.low, d.high + 1, d.step)) > len(
            self.choices
        )

    def distribution(self) -> BaseDistribution:
        if self.kind == "ordinal":
            if self.encoding == "index":
                return IntDistribution(0, len(self.choices) - 1)
            if self.encoding == "values" and all(type(v) is int for v in self.choices):
                lo, hi = self.choices[0], self.choices[-1]
                step = _int_step(self.choices)
                if step is not None:
                    return IntDistribution(lo, hi, step=step)
                return IntDistribution(lo, hi, log=_geometric(self.choices))
            return CategoricalDistribution(self.choices)
        if self.kind == "categorical":
            return CategoricalDistribution(self.choices)
        return CategoricalDistribution(tuple(range(len(self.choices))))

    def snap(self, raw: Any) -> Any:
        """The candidate nearest to a sampled int (in log space for a log range)."""
        d = self.distribution()
        if not isinstance(d, IntDistribution):
            return raw
        f = math.log if d.log else float
        return min(self.choices, key=lambda c: (abs(f(c) - f(raw)), c))

    def encode(self, value: Any) -> Any:
        for i, c in enumerate(self.choices):
            if c == value and type(c) is type(value):
                return c if self._by_value else i
        if self.kind == "categorical" and value in self.choices:
            return value
        raise ValueError(f"{self.name}: {value!r} is not one of {list(self.choices)}")

    def decode(self, raw: Any) -> Any:
        if not self._by_value:
            return self.choices[int(raw)]
        for c in self.choices:
            if c == raw:
                return c
        raise ValueError(f"{self.name}: {raw!r} is not one of {list(self.choices)}")

    def grid_values(self) -> list[Any]:
        if self._by_value:
            return list(self.choices)
        return list(range(len(self.choices)))

    def suggest(self, trial: optuna.trial.BaseTrial) -> Any:
        """Ask `trial` for this parameter (its raw, encoded value)."""
        d = self.distribution()
        if isinstance(d, IntDistribution):
            return trial.suggest_int(self.name, d.low, d.high, step=d.step, log=d.log)
        assert isinstance(d, CategoricalDistribution)
        return trial.suggest_categorical(self.name, d.choices)


def _int_step(values: tuple[Any, ...]) -> int | None:
    """The step of sorted, evenly spaced ints (None otherwise)."""
    step = values[1] - values[0]
    if step <= 0 or any(b - a != step for a, b in itertools.pairwise(values)):
        return None
    return int(step)


def _geometric(values: tuple[int, ...]) -> bool:
    """Positive sorted ints with one ratio between neighbours (128, 256, 512, ...)."""
    if values[0] <= 0:
        return False
    ratio = values[1] / values[0]
    return all(math.isclose(b / a, ratio) for a, b in itertools.pairwise(values))


class CandidateSampler(BaseSampler):
    """Wraps a sampler so that every int-range parameter (`Param.snaps`) lands on one of
    its candidates: a relative sample (TPE's model of the ordered range) is moved to the
    nearest candidate, and an independent one (random start-up trials, random search) is
    drawn uniformly from the candidates, as an index would be. The study stores values,
    and the sampler still sees their order."""

    def __init__(self, inner: BaseSampler, space: SearchSpace, seed: int | None = None) -> None:
        self._inner = inner
        self._params = {p.name: p for p in space.params if p.snaps}
        self._rng = random.Random(seed)

    def infer_relative_search_space(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return self._inner.infer_relative_search_space(study, trial)

    def sample_relative(
        self,
        study: optuna.Study,
        trial: optuna.trial.FrozenTrial,
        search_space: dict[str, BaseDistribution],
    ) -> dict[str, Any]:
        params = self._inner.sample_relative(study, trial, search_space)
        return {n: self._params[n].snap(v) if n in self._params else v for n, v in params.items()}

    def sample_independent(
        self,
        study: optuna.Study,
        trial: optuna.trial.FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        p = self._params.get(param_name)
        if p is not None and p.distribution() == param_distribution:
            return self._rng.choice(p.choices)
        return self._inner.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self._inner.before_trial(study, trial)

    def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
        self._inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._inner.reseed_rng()
        self._rng.seed()


def _param(name: str, values: tuple[Any, ...], encoding: str) -> Param:
    if len(values) == 0:
        raise ValueError(f"search space field {name!r}: expected at least one candidate; got none")
    if len(set(map(repr, values))) != len(values):
        raise ValueError(f"search space field {name!r}: duplicate candidates in {list(values)}")
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    if numeric and len(values) >= 3:
        return Param(name, tuple(sorted(values)), "ordinal", encoding)
    if all(isinstance(v, _PRIMITIVES) for v in values):
        return Param(name, tuple(values), "categorical", encoding)
    return Param(name, tuple(values), "indexed", encoding)


class SearchSpace:
    """The tuning space of one config class for one problem on one target."""

    def __init__(
        self,
        config_cls: type[KernelConfig],
        problem: Any,
        target: Target,
        base: KernelConfig | None = None,
        encoding: str = "values",
    ) -> None:
        """`base` (default: the heuristic) supplies the fields the space does not tune, and
        its tuned values join the candidates if the space lacks them, so the heuristic
        default is always a point of the space. `encoding`: one of `ENCODINGS`."""
        if encoding not in ENCODINGS:
            raise ValueError(f"encoding: expected one of {list(ENCODINGS)}; got {encoding!r}")
        raw = config_cls.search_space(problem, target)
        fields = {f.name for f in dataclasses.fields(config_cls)}
        unknown = set(raw) - fields
        if unknown:
            raise ValueError(
                f"{config_cls.__name__}.search_space: fields {sorted(unknown)} are not config "
                f"fields (expected a subset of {sorted(fields)})"
            )
        if base is None:
            base = config_cls.heuristic(problem, target)
        base_values = base.to_dict()
        params = []
        for name, values in raw.items():
            values = tuple(values)
            v = base_values[name]
            if not any(c == v and type(c) is type(v) for c in values):
                values = (*values, v)
            params.append(_param(name, values, encoding))
        self.config_cls = config_cls
        self.problem = problem
        self.target = target
        self.encoding = encoding
        self.base = base
        self.params: tuple[Param, ...] = tuple(params)
        self._by_name = {p.name: p for p in self.params}

    @property
    def size(self) -> int:
        """Number of configs in the cartesian product (valid or not)."""
        return math.prod(len(p.choices) for p in self.params)

    def is_small(self, threshold: int = GRID_THRESHOLD) -> bool:
        return self.size <= threshold

    def distributions(self) -> dict[str, BaseDistribution]:
        return {p.name: p.distribution() for p in self.params}

    def grid(self) -> dict[str, list[Any]]:
        """The search space in `optuna.samplers.GridSampler` form (encoded values)."""
        return {p.name: p.grid_values() for p in self.params}

    def suggest(self, trial: optuna.trial.BaseTrial) -> KernelConfig:
        """Ask `trial` for every parameter and build the config."""
        return self.decode({p.name: p.suggest(trial) for p in self.params})

    def encode(self, config: KernelConfig) -> dict[str, Any]:
        """The Optuna parameter dict of `config` (for `enqueue_trial`)."""
        values = config.to_dict()
        return {p.name: p.encode(values[p.name]) for p in self.params}

    def decode(self, params: Mapping[str, Any]) -> KernelConfig:
        """The config for an Optuna parameter dict; untuned fields come from `base`."""
        missing = set(self._by_name) - set(params)
        if missing:
            raise ValueError(f"decode: parameters {sorted(missing)} are missing from {params}")
        values = {n: self._by_name[n].decode(params[n]) for n in self._by_name}
        return dataclasses.replace(self.base, **values)

    def configs(self) -> Iterator[KernelConfig]:
        """Every config of the space in a stable order."""
        for combo in itertools.product(*(p.choices for p in self.params)):
            yield dataclasses.replace(self.base, **{p.name: v for p, v in zip(self.params, combo)})

    def with_encoding(self, encoding: str) -> SearchSpace:
        """The same space under another encoding."""
        if encoding == self.encoding:
            return self
        return SearchSpace(self.config_cls, self.problem, self.target, self.base, encoding)

    def encoding_of(self, trials: list[optuna.trial.FrozenTrial]) -> str | None:
        """The encoding whose distributions `trials` were stored with (None: no trial
        has parameters, or they match neither -- the caller keeps its own)."""
        for t in trials:
            if not t.distributions:
                continue
            for enc in (self.encoding, *[e for e in ENCODINGS if e != self.encoding]):
                dists = self.with_encoding(enc).distributions()
                if all(dists.get(n) == d for n, d in t.distributions.items()):
                    return enc
            return None
        return None

    def describe(self) -> str:
        parts = [f"{p.name}={list(p.choices)}" for p in self.params]
        return f"{self.config_cls.__name__}[{self.size}]: " + ", ".join(parts)
