"""`python -m worker`: `timer-service` where the script is not on PATH."""

import sys

from worker.ops.cli import main

sys.exit(main())
