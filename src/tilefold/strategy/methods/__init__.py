"""The built-in kernel methods, one family a file; importing this package registers them all."""

from tilefold.strategy.method import METHODS
from tilefold.strategy.methods import attention as attention
from tilefold.strategy.methods import autocodegen as autocodegen
from tilefold.strategy.methods import blocks as blocks
from tilefold.strategy.methods import extern as extern
from tilefold.strategy.methods import gpu as gpu
from tilefold.strategy.methods import handwritten as handwritten
from tilefold.strategy.methods import lto as lto
from tilefold.strategy.methods import movement as movement
from tilefold.strategy.methods import multitensor as multitensor
from tilefold.strategy.methods import random as random
from tilefold.strategy.methods import scalar as scalar

# Every method these modules registered, kept so that a removed one can be registered again.
BUILTIN = {name: m for name, m in METHODS.items() if type(m).__module__.startswith(f"{__name__}.")}
