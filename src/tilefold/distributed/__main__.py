"""`python -m tilefold.distributed`: the opt driver with the distributed passes registered
(propagate-sharding and spmd-partition beside expand-redistribute and the built-in
passes)."""

import tilefold.distributed  # noqa: F401 - registers propagate-sharding, spmd-partition
from tilefold.passes.driver import main

raise SystemExit(main())
