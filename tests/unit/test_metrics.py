"""metrics.observe_many: one call per batch, the same histogram as observing each amount."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

from worker import metrics


def samples(h: Histogram) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in h.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_observe_many_counts_as_observe_does_each_amount_on_its_bucket_and_in_the_sum() -> None:
    buckets = (0.1, 0.5, 1.0, 5.0)
    one_by_one = Histogram("one", "", buckets=buckets, registry=CollectorRegistry())
    at_once = Histogram("one", "", buckets=buckets, registry=CollectorRegistry())
    amounts = [0.0, 0.1, 0.1000001, 0.5, 0.7, 1.0, 4.9, 5.0, 7.5, 1e9]  # bounds are inclusive
    for a in amounts:
        one_by_one.observe(a)
    metrics.observe_many(at_once, amounts)
    metrics.observe_many(at_once, [])
    assert samples(at_once) == samples(one_by_one)
