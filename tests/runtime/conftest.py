"""Runtime tests use a private cache dir, and run risky code in fresh, time-limited processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest


@pytest.fixture(scope="session", autouse=True)
def private_cache_dir(tmp_path_factory: pytest.TempPathFactory):
    """Point TILEFOLD_CACHE_DIR at a temporary folder for the session (subprocesses inherit)."""
    previous = os.environ.get("TILEFOLD_CACHE_DIR")
    path = tmp_path_factory.mktemp("tilefold-cache")
    os.environ["TILEFOLD_CACHE_DIR"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("TILEFOLD_CACHE_DIR", None)
    else:
        os.environ["TILEFOLD_CACHE_DIR"] = previous


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
