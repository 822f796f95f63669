"""Runtime tests run risky code in fresh, time-limited processes (the private cache dir they
inherit is set up by tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest


@pytest.fixture
def run_python():
    """Run Python code in a fresh interpreter (runtime_pool_kernels importable); return stdout.

    A deadlock shows up as a failed test after `timeout` seconds, never as a hung suite.
    """
    here = os.path.dirname(__file__)

    def run(code: str, *, env: dict[str, str] | None = None, timeout: float = 60) -> str:
        full_env = {**os.environ, **(env or {})}
        full_env["PYTHONPATH"] = os.pathsep.join(
            [here, *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        try:
            done = subprocess.run(
                [sys.executable, "-c", textwrap.dedent(code)],
                env=full_env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"subprocess timed out after {timeout} s (deadlock?):\n{exc.stderr}")
        assert done.returncode == 0, done.stderr
        return done.stdout

    return run
