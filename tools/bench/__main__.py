"""`python -m tools.bench` (what `make bench` runs), from the repository's root."""

import sys

from tools.bench import main

sys.exit(main())
