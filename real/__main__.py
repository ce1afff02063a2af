"""``python -m real``: the command line lives in :mod:`analysis.cli.train` (the one home of flags)."""

from analysis.cli.train import main

raise SystemExit(main())
