"""`tilefold bench blocks` as a script (run it under `flock /tmp/tilefold-bench.lock`)."""

import sys

from tilefold.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["bench", "blocks", *sys.argv[1:]]))
