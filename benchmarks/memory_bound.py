"""`tilefold bench memory` as a script: softmax, layer_norm and rms_norm against NumPy, eager and
torch.compile. Run it alone: `flock /tmp/tilefold-bench.lock python benchmarks/memory_bound.py`."""

import sys

from tilefold.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["bench", "memory", *sys.argv[1:]]))
