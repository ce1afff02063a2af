"""``python -m sim``: the command line lives in :mod:`analysis.cli.simulate` (the one home of flags)."""

from analysis.cli.simulate import main

raise SystemExit(main())
