"""`timer-service bench`: benchmark scenarios (being built; see docs/BENCHMARKS.md)."""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenarios", nargs="*", help="scenarios to run (default: all)")
    p.add_argument("--json", action="store_true", help="machine-readable results")


def run_bench(args: argparse.Namespace) -> int:
    print("timer-service bench: no scenarios yet", file=sys.stderr)
    return 2
