"""``torchrun -m real.rounds SPEC.json``: the command line lives in :mod:`analysis.cli.rounds` (the one home of flags)."""

from analysis.cli.rounds import main

raise SystemExit(main())
