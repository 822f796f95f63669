"""`tilefold bench blocks` as a script (run it under `flock /tmp/tilefold-bench.lock`)."""

import argparse
import sys

from tilefold.cli import bench_blocks

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=bench_blocks.__doc__)
    bench_blocks.add_arguments(parser)
    sys.exit(bench_blocks.run(parser.parse_args()))
