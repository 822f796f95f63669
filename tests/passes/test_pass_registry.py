"""Every pass is registered by its own file, and importing the package registers them all."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys

import tilefold.passes
from tilefold.passes import PASSES, Pass


def _pass_classes() -> list[type[Pass]]:
    """Every `Pass` subclass defined in a module of `tilefold.passes`."""
    found = []
    for info in pkgutil.iter_modules(tilefold.passes.__path__):
        if info.name == "__main__":  # the driver's command line, not a module to import
            continue
        module = importlib.import_module(f"tilefold.passes.{info.name}")
        found += [cls for _, cls in inspect.getmembers(module, inspect.isclass)
                  if issubclass(cls, Pass) and cls is not Pass
                  and cls.__module__ == module.__name__]
    return found


def test_every_pass_class_is_registered_under_its_name():
    classes = _pass_classes()
    assert len(classes) >= 7
    assert {cls.name: cls for cls in classes} == {n: c for n, c in PASSES.items()
                                                 if c.__module__.startswith("tilefold.passes.")}


def test_importing_the_registry_alone_registers_every_pass():
    """The registry module holds no pass list: the package import is what fills it."""
    code = ("from tilefold.passes.registry import PASSES; "
            "print(','.join(sorted(PASSES)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().split(",") == sorted(cls.name for cls in _pass_classes())
