"""`python -m pollen.tools.cli COMMAND ...`: the `pollen` command (tests and benchmarks run it
this way, with the interpreter they choose)."""

from pollen.tools.cli import main

raise SystemExit(main())
