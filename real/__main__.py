import sys

from real.cli import main

sys.exit(main())
