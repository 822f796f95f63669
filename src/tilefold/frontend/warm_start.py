"""Compile times as a user meets them: the first call of a compiled model in a new process,
cold (every cache empty: the first run on a machine) and warm (the caches the cold run filled:
running a program again).

They have to be child processes: the parent holds Dynamo's and the backends' in-memory state,
and a fresh process also pays for what Dynamo imports and sets up on first use (most of the warm
time, for tilefold). Both children use one temporary cache directory (tilefold's and inductor's),
so the user's caches are neither used nor touched.
`python -m tilefold.frontend.warm_start MODEL BACKEND BATCH SEQ THREADS` prints the seconds of
one first call as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence

log = logging.getLogger("tilefold.frontend")
TIMEOUT_S = 600


def compile_times(model: str, backend: str, batch: int, seq: int, layers: int | None,
                  threads: int) -> dict[str, float]:
    """{"cold": s, "warm": s}: first-call seconds (one model run included) in a new process with
    empty caches, then in another with the caches the first filled; a failed child leaves its
    entry out, with a warning."""
    command = [sys.executable, "-m", "tilefold.frontend.warm_start", model, backend, str(batch),
               str(seq), str(threads)] + ([] if layers is None else ["--layers", str(layers)])
    times: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="tilefold-compile-times-") as tmp:
        env = {**os.environ, "TILEFOLD_CACHE_DIR": os.path.join(tmp, "tilefold"),
               "TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, "inductor")}
        for kind in ("cold", "warm"):
            seconds = _first_call(command, env, f"{kind} compile of {model} with {backend}")
            if seconds is None:
                break
            times[kind] = seconds
    return times


def _first_call(command: list[str], env: dict[str, str], what: str) -> float | None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S,
                              check=True, env=env)
        return float(json.loads(done.stdout.strip().splitlines()[-1])["first_call"])
    except subprocess.CalledProcessError as exc:
        why = (exc.stderr or "").strip().splitlines()[-1:] or [f"exit status {exc.returncode}"]
        log.warning("%s failed: %s", what, why[0])
    except (subprocess.TimeoutExpired, ValueError, KeyError, IndexError) as exc:
        log.warning("%s failed: %s", what, exc)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model")
    parser.add_argument("backend")
    parser.add_argument("batch", type=int)
    parser.add_argument("seq", type=int)
    parser.add_argument("threads", type=int)
    parser.add_argument("--layers", type=int, default=None)
    args = parser.parse_args(argv)
    import torch

    from tilefold.frontend import demo

    torch.set_num_threads(args.threads)
    first = demo.first_call(args.model, args.backend, args.batch, args.seq, args.layers)
    print(json.dumps({"first_call": first}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
