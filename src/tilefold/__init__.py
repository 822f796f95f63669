"""tilefold: a compiler for AI programs that generates fused, portable kernels at vendor speed."""

from tilefold.errors import (
    CacheError,
    CompileError,
    DTypeError,
    ParseError,
    PassError,
    ShapeError,
    TilefoldError,
    UnsupportedError,
    VerificationError,
)

__version__ = "0.1.0"

__all__ = [
    "CacheError",
    "CompileError",
    "DTypeError",
    "ParseError",
    "PassError",
    "ShapeError",
    "TilefoldError",
    "UnsupportedError",
    "VerificationError",
    "__version__",
]
