"""Draw docs/lateness.png from `timer-service bench sweep --json` output.

timer-service bench sweep --runs 1 --json > sweep.json
pip install matplotlib && python docs/plot_lateness.py sweep.json docs/lateness.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after choosing the headless backend

with open(sys.argv[1]) as f:
    report = json.load(f)
median = report["results"]["sweep"]["median"]
rates = sorted({int(k.split("@")[1]) for k in median})
fig, ax = plt.subplots(figsize=(7, 4.2))
for key, label in (("lateness_p50_ms", "p50"), ("lateness_p99_ms", "p99"), ("lateness_max_ms", "max")):
    ax.plot(rates, [median[f"{key}@{r}"] for r in rates], marker="o", label=label)
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_xlabel("timers coming due per second")
ax.set_ylabel("lateness: consumer receive time - dueAt (ms)")
cores = report["machine"].get("cpus")
ax.set_title(f"timer-service, {report['replicas']} replicas, {cores} cores, NATS sync {report['nats_sync']}")
ax.grid(True, which="both", alpha=0.3)
ax.legend()
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
