"""``python -m real.data prepare --input FILES --out PATH``: the command line lives in :mod:`analysis.cli.data`."""

from analysis.cli.data import main

raise SystemExit(main())
