"""A kernel config's search space as Optuna parameters.

`KernelConfig.search_space(problem, target)` gives candidate values per field. Here each
field becomes one Optuna parameter:

- numeric fields (ints or floats, not bools) with three or more candidates are *ordinal*:
  the parameter is the index into the sorted candidates (`IntDistribution(0, n - 1)`), so
  TPE learns that 256 sits between 128 and 512;
- other fields whose candidates are all str / int / float / bool / None are categorical
  over the values themselves (readable in the study);
- anything else (tuples, enums) is categorical over candidate indices.

The same encoding feeds `GridSampler` (`grid()`), `enqueue_trial` (`encode`) and decoding
(`decode`), so a config maps to exactly one parameter dict and back.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from ..kernel_config import KernelConfig
from ..targets import Target

_PRIMITIVES = (str, int, float, bool, type(None))

# Spaces up to this many configs are searched exhaustively by default.
GRID_THRESHOLD = 64


@dataclass(frozen=True)
class Param:
    """One config field as an Optuna parameter: its candidates and how they are encoded."""

    name: str
    choices: tuple[Any, ...]
    kind: str  # "ordinal" | "categorical" | "indexed"

    def distribution(self) -> BaseDistribution:
        if self.kind == "ordinal":
            return IntDistribution(0, len(self.choices) - 1)
        if self.kind == "categorical":
            return CategoricalDistribution(self.choices)
        return CategoricalDistribution(tuple(range(len(self.choices))))

    def encode(self, value: Any) -> Any:
        if self.kind == "categorical":
            if value not in self.choices:
                raise ValueError(f"{self.name}: {value!r} is not one of {list(self.choices)}")
            return value
        for i, c in enumerate(self.choices):
            if c == value and type(c) is type(value):
                return i
        raise ValueError(f"{self.name}: {value!r} is not one of {list(self.choices)}")

    def decode(self, raw: Any) -> Any:
        if self.kind == "categorical":
            return raw
        return self.choices[int(raw)]

    def grid_values(self) -> list[Any]:
        if self.kind == "categorical":
            return list(self.choices)
        return list(range(len(self.choices)))


def _param(name: str, values: tuple[Any, ...]) -> Param:
    if len(values) == 0:
        raise ValueError(f"search space field {name!r}: expected at least one candidate; got none")
    if len(set(map(repr, values))) != len(values):
        raise ValueError(f"search space field {name!r}: duplicate candidates in {list(values)}")
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    if numeric and len(values) >= 3:
        return Param(name, tuple(sorted(values)), "ordinal")
    if all(isinstance(v, _PRIMITIVES) for v in values):
        return Param(name, tuple(values), "categorical")
    return Param(name, tuple(values), "indexed")


class SearchSpace:
    """The tuning space of one config class for one problem on one target."""

    def __init__(
        self,
        config_cls: type[KernelConfig],
        problem: Any,
        target: Target,
        base: KernelConfig | None = None,
    ) -> None:
        """`base` (default: the heuristic) supplies the fields the space does not tune, and
        its tuned values join the candidates if the space lacks them, so the heuristic
        default is always a point of the space."""
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
            params.append(_param(name, values))
        self.config_cls = config_cls
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
        params: dict[str, Any] = {}
        for p in self.params:
            if p.kind == "ordinal":
                params[p.name] = trial.suggest_int(p.name, 0, len(p.choices) - 1)
            elif p.kind == "categorical":
                params[p.name] = trial.suggest_categorical(p.name, p.choices)
            else:
                params[p.name] = trial.suggest_categorical(p.name, tuple(range(len(p.choices))))
        return self.decode(params)

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

    def describe(self) -> str:
        parts = [f"{p.name}={list(p.choices)}" for p in self.params]
        return f"{self.config_cls.__name__}[{self.size}]: " + ", ".join(parts)
