"""The pass tests also draw random modules from the IR tests' strategies (tests/ir)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ir"))
