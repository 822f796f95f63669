"""`python -m tilefold.passes`: the opt driver (see driver.py)."""

from tilefold.passes.driver import main

raise SystemExit(main())
