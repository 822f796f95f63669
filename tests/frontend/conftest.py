"""Frontend tests need PyTorch; model tests also need transformers (the `demo` extra)."""

import os

import pytest

pytest.importorskip("torch")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
