"""``python -m real``: the command line lives in :mod:`analysis.cli.train` (the one home of flags)."""

try:
    from analysis.cli.train import main
except KeyboardInterrupt:  # Ctrl-C while torch is imported: the shell's status, no traceback
    raise SystemExit(130) from None

raise SystemExit(main())
