"""Where a training step's peak memory goes, phase by phase (Linux only).

Builds `tilefold bench train`'s step (the same `bench_train.stepper` model, inputs and AdamW)
for one contender and prints, after each phase (imports, model built, each step's forward,
backward and optimizer step), the process's resident set (`VmRSS`), the peak within that phase
(`VmHWM`, reset between phases through `/proc/self/clear_refs`) and glibc's heap (`mallinfo2`:
bytes in use, free bytes it keeps). For tilefold it then lists what the compiled graphs hold:
the shared intermediate pool (reserved and touched bytes), each plan's share of it and its own
buffers, the JIT'd modules' object code, and the bytes of fresh tensors the forward returns
(what autograd saves). Run one contender per process, under `flock -x /tmp/tf-cpu.lock`:

    python benchmarks/train_rss.py tilefold   # or eager, inductor; --model gpt2 --steps 3
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os

MB = 1 << 20


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _status() -> dict[str, int]:
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {k: int(fields[k].split()[0]) // 1024 for k in ("VmRSS", "VmHWM")}


def _heap() -> tuple[int, int]:
    """(bytes malloc has handed out, free bytes it keeps), all arenas."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _Mallinfo2
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd, info.fordblks


def phase(name: str) -> None:
    """Print the phase's figures (MB), then restart the peak for the next phase."""
    gc.collect()
    status, (used, free) = _status(), _heap()
    print(f"{name:<18} peak {status['VmHWM']:>5}  rss {status['VmRSS']:>5}  "
          f"heap used {used // MB:>4}  heap free {free // MB:>4}", flush=True)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS


def held_by_tilefold() -> None:
    """What the live compiled graphs hold."""
    from tilefold import compiler
    from tilefold.runtime.compiled_module import CompiledModule

    live = gc.get_objects()
    for pool in (o for o in live if isinstance(o, compiler.SharedBuffers)):
        print(f"shared pool: {pool.nbytes / MB:.1f} MB reserved, {pool.held / MB:.1f} touched")
    for graph in (o for o in live if isinstance(o, compiler.CompiledGraph)):
        for plan in graph._plans.values():
            print(f"plan of {len(graph.function.outputs)} results: "
                  f"{plan.shared_bytes / MB:.1f} MB of the pool, own {plan.held / MB:.1f} MB")
    modules = [o for o in live if isinstance(o, CompiledModule)]
    print(f"{len(modules)} JIT'd modules, object code "
          f"{sum(len(m.object_code) for m in modules) / MB:.2f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("contender", choices=("tilefold", "eager", "inductor"))
    parser.add_argument("--model", default="minilm", choices=("minilm", "gpt2"))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    os.environ["TILEFOLD_NUM_THREADS"] = str(args.threads)
    phase("start")
    import torch

    from tilefold.cli import bench_train

    torch.set_num_threads(args.threads)
    phase("imports")
    backend = bench_train.CONTENDERS[args.contender]
    model, inputs = bench_train.build(args.model, 8, 128, 2)
    run = model if backend is None else torch.compile(model, backend=backend, dynamic=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    update = opt.step if backend is None else torch.compile(opt.step, backend=backend)
    phase("model built")
    saved = 0
    for step in range(args.steps):
        opt.zero_grad(set_to_none=True)
        loss = run(*inputs)
        if step == 0:
            saved = _saved_bytes(loss, [*model.parameters(), *inputs])
        phase(f"step {step} forward")
        loss.backward()
        phase(f"step {step} backward")
        update()
        phase(f"step {step} optimizer")
        del loss
    print(f"saved for the backward: {saved / MB:.1f} MB of fresh tensors")
    if args.contender == "tilefold":
        held_by_tilefold()


def _saved_bytes(loss, owned: list) -> int:
    """Bytes of the distinct storages autograd saved for `loss`'s backward, but those of
    `owned` (the parameters and the step's inputs)."""
    from tilefold.frontend.training import saved_tensors

    skip = {t.untyped_storage().data_ptr() for t in owned}
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for t in saved_tensors(loss)}
    return sum(n for ptr, n in seen.items() if ptr not in skip)


if __name__ == "__main__":
    main()
