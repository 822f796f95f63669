"""The tilefold version, in one place (cache keys and the tuning database include it), and the
digest of the code itself (for what is saved whole, such as a generator's compiled step)."""

from __future__ import annotations

import functools
import os

__version__ = "0.2.0"


@functools.cache
def code_digest() -> str:
    """A digest of every source file of the installed tilefold package, by name, size and
    modification time (as Python's own .pyc files are checked): anything saved under it was
    made by this code."""
    import hashlib  # here: `import tilefold` (and the artifact loader) need not load it

    root = os.path.dirname(os.path.abspath(__file__))
    entries = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [d for d in subfolders if d != "__pycache__"]
        for name in files:
            if name.endswith((".py", ".c", ".h", ".ll")):
                stat = os.stat(os.path.join(folder, name))
                entries.append(f"{os.path.relpath(folder, root)}/{name} {stat.st_size} "
                               f"{stat.st_mtime_ns}")
    text = "\n".join([__version__, *sorted(entries)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]
