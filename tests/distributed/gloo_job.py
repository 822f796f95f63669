"""One spawned gloo job for the `parallelize` tests: every rank runs each parallelized model
on its block's example input and saves what it returns, for the test to compare with one
process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.distributed.test_torchrun import free_port
from tests.distributed.torch_blocks import model_and_input


def as_arrays(result) -> dict[str, np.ndarray]:
    """A forward's output as {"out": ...}; a training step's (loss, grads) as {"loss", *grads}."""
    if isinstance(result, torch.Tensor):
        return {"out": result.numpy()}
    value, grads = result
    return {"loss": value.numpy(), **{n: g.numpy() for n, g in grads.items()}}


def _rank_main(rank: int, world: int, port: int, folder: str, programs) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        for key, block, parallel in programs:
            _, x = model_and_input(block)
            inputs = x if isinstance(x, tuple) else (x,)
            np.savez(Path(folder) / f"{key}.{rank}.npz", **as_arrays(parallel(*inputs)))
    finally:
        dist.destroy_process_group()


def run_gloo_job(programs: list[tuple[str, str, object]], world: int,
                 folder: Path) -> dict[str, list[dict[str, np.ndarray]]]:
    """Run each (key, block, parallelized model) on `world` gloo processes, spawned once for
    all of them; each key's saved arrays in rank order."""
    mp.spawn(_rank_main, args=(world, free_port(), str(folder), programs), nprocs=world)
    got = {}
    for key, _, _ in programs:
        got[key] = []
        for rank in range(world):
            with np.load(folder / f"{key}.{rank}.npz") as f:
                got[key].append({n: f[n] for n in f.files})
    return got
