"""Transformer models through tilefold vs PyTorch eager and torch.compile, written as JSON.

    python benchmarks/models.py --models minilm,bert,gpt2,llama --out models.json

Each model runs batch x seq random tokens (8 x 128 by default, the issue's setting) and reports
median latency and compile times (cold = first call minus steady state; warm = the same after
resetting Dynamo with in-process caches populated). Run it under `flock /tmp/tilefold-bench.lock`.
"""

from __future__ import annotations

import argparse
import json
import sys

from tilefold.frontend import demo


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="minilm,bert,gpt2,llama")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-inductor", action="store_true")
    parser.add_argument("--out", default="models.json")
    args = parser.parse_args()
    missing = demo.missing_packages("minilm")
    if missing:
        print(f"needs {', '.join(missing)}: {demo.INSTALL}")
        return 2
    import torch

    results = {}
    for name in args.models.split(","):
        model, _ = demo.load_model(name, None)
        inputs = demo.random_inputs(name, args.batch, args.seq)
        with torch.no_grad():
            rows = demo.benchmark(model, inputs, args)
        print(f"\n{name}: batch {args.batch} x {args.seq}")
        demo.print_table(rows)
        results[name] = rows
    with open(args.out, "w") as f:
        json.dump({"batch": args.batch, "seq": args.seq, "threads": torch.get_num_threads(),
                   "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
