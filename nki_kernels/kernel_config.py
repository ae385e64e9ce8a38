"""Tunable kernel configurations: the contract shared by kernels, runtime and autotuner.

Each kernel family defines a frozen dataclass subclass of `KernelConfig` holding its tile
sizes and schedule choices, with a heuristic default, the full search space and a
validity check for a given problem (bucketed shapes and dtypes) and target.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Iterator
from typing import Any, ClassVar, TypeVar

from .targets import Target

C = TypeVar("C", bound="KernelConfig")


class InvalidConfig(ValueError):
    """A configuration cannot run for a problem on a target; `reason` says which rule."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Base class: subclasses are frozen dataclasses of plain (hashable, JSON-able) fields."""

    op_name: ClassVar[str] = ""

    @classmethod
    def heuristic(cls: type[C], problem: Any, target: Target) -> C:
        """The default configuration for `problem` on `target` (always valid)."""
        raise NotImplementedError

    @classmethod
    def search_space(cls, problem: Any, target: Target) -> dict[str, tuple[Any, ...]]:
        """Candidate values per field; the cartesian product is the tuning space."""
        raise NotImplementedError

    def validate(self, problem: Any, target: Target) -> None:
        """Raise InvalidConfig(reason) when this config cannot run `problem` on `target`."""

    def is_valid(self, problem: Any, target: Target) -> bool:
        try:
            self.validate(problem, target)
        except InvalidConfig:
            return False
        return True

    @classmethod
    def space(cls: type[C], problem: Any, target: Target) -> Iterator[C]:
        """Every configuration of the search space (valid or not), in a stable order."""
        space = cls.search_space(problem, target)
        names = list(space)
        for values in itertools.product(*(space[n] for n in names)):
            yield cls(**dict(zip(names, values)))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls: type[C], data: dict[str, Any]) -> C:
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - fields
        if unknown:
            raise ValueError(
                f"{cls.__name__}: expected config fields among {sorted(fields)}; got unknown "
                f"field(s) {sorted(unknown)}"
            )
        return cls(**data)

    def key(self) -> str:
        """A stable string identifying this config (cache keys, logs)."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
