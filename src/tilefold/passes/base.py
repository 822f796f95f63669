"""The pass interface: a pass is a class that declares its summary, options and statistics.

    @register_pass
    class DCE(Pass):
        "Erase pure ops whose results are never used."

        statistics = (Statistic("num-erased", "ops erased"),)

        def run_on_function(self, fn): ...

`register_pass` names it after the class (`dce`) and takes the docstring's first line as its
summary; a class may set `name` and `summary` itself.

Options are written in pipelines with dashes (`size-limit=64`) and read in Python with
underscores (`self.size_limit`); statistics are counters a pass bumps with `self.count(...)`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, ClassVar

from tilefold.errors import PassError
from tilefold.ir import Function, Module

OPTION_TYPES = (bool, int, float, str, dict)


@dataclass(frozen=True)
class Statistic:
    """A counter a pass keeps, reported by `--pass-statistics`."""

    name: str
    doc: str


@dataclass(frozen=True)
class Option:
    """A pass option: its pipeline name, type, default and meaning.

    `type` is bool, int, float, str, or dict for a map of names to sizes (`batch=8,seq=128`).
    """

    name: str
    type: type
    default: Any
    doc: str

    def __post_init__(self) -> None:
        assert self.type in OPTION_TYPES, self.type

    @property
    def attr(self) -> str:
        """The Python spelling: `size-limit` -> `size_limit`."""
        return self.name.replace("-", "_")

    @property
    def metavar(self) -> str:
        """How the value is written, for help texts."""
        return "name=size,..." if self.type is dict else self.type.__name__

    def parse(self, text: str) -> Any:
        """The option's value from its pipeline text; ValueError says what was expected."""
        if self.type is bool:
            if text not in ("true", "false", "1", "0"):
                raise ValueError("expected true or false")
            return text in ("true", "1")
        if self.type is dict:
            return _parse_sizes(text)
        try:
            return self.type(text)
        except ValueError:
            raise ValueError(
                f"expected {'an' if self.type is int else 'a'} {self.type.__name__}"
            ) from None

    def check(self, value: Any) -> Any:
        """A Python value for the option, checked against its type."""
        if self.type is dict:
            ok = isinstance(value, dict) and all(
                isinstance(k, str) and type(v) is int and v >= 0 for k, v in value.items()
            )
        elif self.type is float:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        else:
            ok = type(value) is self.type
        if not ok:
            raise ValueError(f"expected {self.type.__name__}, got {value!r}")
        return float(value) if self.type is float else value

    def format(self, value: Any) -> str:
        """The pipeline text of a value (inverse of `parse`)."""
        if self.type is bool:
            return "true" if value else "false"
        if self.type is dict:
            return ",".join(f"{k}={v}" for k, v in value.items())
        return str(value)


def _parse_sizes(text: str) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for item in filter(None, text.split(",")):
        name, eq, size = item.partition("=")
        name = name.removeprefix("?")
        if not eq or not name.isidentifier() or not size.isdigit():
            raise ValueError(f"expected name=size pairs like batch=8, got {item!r}")
        sizes[name] = int(size)
    return sizes


class Pass:
    """Base of passes. Subclasses set the class attributes (`name` and `summary` given by
    `register_pass` unless set) and override `run_on_function` (or `run` for a pass that needs
    the whole module)."""

    name: ClassVar[str]
    summary: ClassVar[str]
    options: ClassVar[tuple[Option, ...]] = ()
    statistics: ClassVar[tuple[Statistic, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if isinstance(cls.statistics, dict):  # the older {name: doc} spelling
            cls.statistics = tuple(Statistic(k, v) for k, v in cls.statistics.items())

    def __init__(self, **values: Any):
        by_attr = {o.attr: o for o in self.options}
        for key in values:
            if key not in by_attr:
                raise PassError(f"pass '{self.name}' has no option '{key}'{_options_hint(self)}")
        for option in self.options:
            if option.attr in values:
                try:
                    value = option.check(values[option.attr])
                except ValueError as exc:
                    raise PassError(f"{self.name}{{{option.name}}}: {exc}") from None
            else:
                value = copy.deepcopy(option.default)
            setattr(self, option.attr, value)
        self.stats: dict[str, int] = {s.name: 0 for s in self.statistics}

    @classmethod
    def from_text(cls, options: dict[str, str]) -> Pass:
        """An instance from textual options (`{"size-limit": "64"}`), as a pipeline gives them."""
        by_name = {o.name: o for o in cls.options}
        values = {}
        for key, text in options.items():
            option = by_name.get(key)
            if option is None:
                raise PassError(f"pass '{cls.name}' has no option '{key}'{_options_hint(cls)}")
            try:
                values[option.attr] = option.parse(text)
            except ValueError as exc:
                raise PassError(f"{cls.name}{{{key}={text}}}: {exc}") from None
        return cls(**values)

    def count(self, statistic: str, n: int = 1) -> None:
        """Add `n` to a declared statistic."""
        self.stats[statistic] += n

    def run(self, module: Module) -> None:
        """Transform `module` in place; by default each function on its own."""
        for fn in module.functions.values():
            self.run_on_function(fn)

    def run_on_function(self, fn: Function) -> None:
        raise NotImplementedError(f"pass '{self.name}' must define run() or run_on_function()")

    def __repr__(self) -> str:
        return f"<pass {self}>"

    def __str__(self) -> str:
        """The pipeline spelling, with the options that differ from their defaults."""
        changed = [
            f"{o.name}={o.format(getattr(self, o.attr))}"
            for o in self.options
            if getattr(self, o.attr) != o.default
        ]
        return f"{self.name}{{{' '.join(changed)}}}" if changed else self.name


def _options_hint(cls: type[Pass] | Pass) -> str:
    names = ", ".join(o.name for o in cls.options)
    return f" (it has: {names})" if names else " (it takes none)"
