"""The benchmarks' tests (tools/bench), each file after the module it runs; `run_json` runs one as
`timer-service bench` would. Speed lives in docs/BENCHMARKS.md, not here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]


def run_json(argv: list[str], env: dict[str, str] | None = None, timeout: int = 600) -> tuple[Any, str]:
    """Run `python <argv>` from the repository root; its JSON report (it must exit 0) and its stderr."""
    out = subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    # The line that says why (a scenario that could not finish) may be above the replicas' last
    # log lines, which are all the tail would show.
    why = [line for line in out.stderr.splitlines() if line.startswith(("bench ", "Traceback", "Error"))]
    assert out.returncode == 0, "\n".join([*why, "...", out.stderr[-3000:]])
    return json.loads(out.stdout), out.stderr
