"""Frontend tests need PyTorch; model tests also need transformers (the `demo` extra)."""

import logging
import os
import sys

import pytest

pytest.importorskip("torch")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@pytest.fixture(autouse=True)
def quiet_dynamo_trace(monkeypatch):
    """Dynamo's structured trace log (always at DEBUG) would fill a failure's captured log with
    thousands of lines."""
    monkeypatch.setattr(logging.getLogger("torch.__trace"), "disabled", True)


def pytest_terminal_summary(terminalreporter) -> None:
    """After a run that included test_opinfo.py (test_opinfo_grad.py): the OpInfo pass rates
    (the gradients' outcomes and native share) per op and overall."""
    for module, title in (("opinfo_harness", "OpInfo samples through the tilefold backend"),
                          ("opinfo_grad_harness", "OpInfo gradients through the tilefold "
                                                  "backend, strict")):
        harness = sys.modules.get(module)
        if harness is None or not harness.RESULTS:
            continue
        terminalreporter.section(title)
        for line in harness.summary():
            terminalreporter.write_line(line)


@pytest.fixture
def restore_threads(monkeypatch):
    """For tools that set torch's and tilefold's thread counts for the whole process."""
    import torch

    monkeypatch.setenv("TILEFOLD_NUM_THREADS", "1")
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)
