"""``python -m real.profile``: the command line lives in :mod:`analysis.cli.profile` (the one home of flags)."""

from analysis.cli.profile import main

raise SystemExit(main())
