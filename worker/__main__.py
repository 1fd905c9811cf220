"""`python -m worker`: the `timer-service` command, for where the script is not on PATH."""

import sys

from worker.ops.cli import main

sys.exit(main())
