"""The fleet over a range (worker/ops/fleet_stats.py, series; sql console_stats): the replicas' minute
rows of up to a week, added up in Postgres into at most MAX_POINTS bins that keep the rates, the
histograms and the overdue peak; the rows kept bounded by the retention; the console's ranges."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from starlette.testclient import TestClient

from tests.helpers import query
from tests.integration.ops.test_console import _login, console_settings
from worker.adapters.postgres.queries import QUERIES
from worker.adapters.postgres.stats import STATS_KEEP
from worker.config import Settings
from worker.ops.console.app import create_app
from worker.ops.fleet_stats import MAX_POINTS, RANGES, series, step_for

REPLICAS = ("replica-a", "replica-b")


def _minutes(db_url: str, since_min: int, until_min: int = 0) -> None:
    """Both replicas' rows for every minute from `since_min` to `until_min` minutes ago: 60 fired,
    2 rejected, one firing in the first lateness bucket, overdue rising with the minute's age."""
    query(
        db_url,
        "INSERT INTO timer_stats (minute, worker_id, fired, rejected, overdue, lateness_le, lateness) "
        "SELECT date_trunc('minute', now()) - i * interval '1 minute', w, 60, 2, i, "
        "       '{0.01,0.1,1}', '{1,0,0}' "
        "FROM generate_series(%s::int, %s::int) AS i, unnest(%s::text[]) AS w",
        until_min,
        since_min,
        list(REPLICAS),
    )


@pytest.mark.parametrize("chosen", list(RANGES))
def test_a_range_is_at_most_max_points_each_keeping_the_rates_and_histograms(
    db_url: str, chosen: str
) -> None:
    _minutes(db_url, since_min=8 * 24 * 60)
    window = RANGES[chosen]
    step = step_for(window)
    with psycopg.connect(db_url) as conn:
        drawn = series(conn, window)
    assert len(drawn) <= MAX_POINTS
    assert len(drawn) >= window // step, "a bin for every step of the window: the data is all there"
    assert (drawn[-1].at - drawn[0].at).total_seconds() >= (window - step) * 60
    whole = drawn[:-1]  # the current bin is under way
    assert all(b.fires_per_s == pytest.approx(2 * 60 / 60) for b in whole)  # both replicas' 60 a minute
    assert all(b.rejected == pytest.approx(2 * 2) for b in whole)  # a minute, on average
    assert all(b.counts == (2 * step, 0, 0) for b in whole), {b.counts for b in whole}
    assert all(b.p99_s is not None and b.p99_s <= 0.01 for b in whole)
    assert all(b.replicas == len(REPLICAS) for b in drawn)
    # Overdue is the bin's highest: the oldest minute of each bin (the gauge is its age here).
    ages = [round((drawn[-1].at - b.at).total_seconds() / 60) for b in whole]
    assert all(b.overdue >= age for b, age in zip(whole, ages, strict=True))


def test_a_bin_adds_the_replicas_of_another_histogram_to_its_rates_not_its_quantiles(db_url: str) -> None:
    _minutes(db_url, since_min=3, until_min=1)
    query(
        db_url,
        "INSERT INTO timer_stats "
        "(minute, worker_id, fired, rejected, overdue, lateness_le, lateness, written_at) "
        "VALUES (date_trunc('minute', now()) - interval '2 minutes', 'replica-old', 60, 0, 0, "
        "        '{5}', '{9}', now() - interval '1 hour')",
    )
    with psycopg.connect(db_url) as conn:
        (one,) = [b for b in series(conn, 60) if b.replicas == 3]
    assert (
        one.fires_per_s == pytest.approx(3.0) and one.counts == (2, 0, 0) and one.bounds == (0.01, 0.1, 1.0)
    )


def test_the_rows_kept_stay_within_the_retention_whatever_was_written(db_url: str) -> None:
    _minutes(db_url, since_min=10 * 24 * 60)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(QUERIES["stats_trim"], {"keep": STATS_KEEP})
    kept_min = int(STATS_KEEP.total_seconds() // 60)
    ((rows, oldest_min),) = query(
        db_url,
        "SELECT count(*), extract(epoch FROM date_trunc('minute', now()) - min(minute)) / 60 "
        "FROM timer_stats",
    )
    assert rows <= len(REPLICAS) * (kept_min + 1) and oldest_min <= kept_min


@pytest.fixture
def logged_in(settings: Settings, db_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(console_settings(settings)), follow_redirects=False) as c:
        _login(c)
        yield c


def test_the_overview_switches_its_charts_range_and_refuses_another_in_one_line(
    logged_in: TestClient, db_url: str
) -> None:
    _minutes(db_url, since_min=3 * 60 + 10, until_min=3 * 60)  # three hours ago, nothing since

    def fires(page: str) -> str:
        match = re.search(r'id="chart-fires"><figcaption>Fires per second <small>([^<]*)<', page)
        assert match, page
        return match.group(1)

    hour = logged_in.get("/").text
    assert fires(hour) == "no data yet" and '<b aria-current="page">1h</b>' in hour
    six = logged_in.get("/?range=6h").text
    assert fires(six).startswith("fires/s ") and '<b aria-current="page">6h</b>' in six
    assert "a point per 4 minutes" in six  # 360 minutes in 119 steps
    # The axis spans the range asked for, not only the data: the gap up to now shows.
    left = re.search(r'id="chart-fires">.*?<text class="tick" x="44" y="116">(\d\d:\d\d)Z<', six, re.S)
    assert left, six
    wanted = {(datetime.now(UTC) - timedelta(hours=6, minutes=m)).strftime("%H:%M") for m in (-1, 0, 1)}
    assert left.group(1) in wanted
    # A longer range is read again once a minute, not on each look; the last hour on each look.
    query(
        db_url,
        "INSERT INTO timer_stats (minute, worker_id, fired, rejected, overdue, lateness_le, lateness) "
        "VALUES (date_trunc('minute', now()) - interval '1 minute', 'replica-a', 600, 0, 0, '{1}', '{0}')",
    )
    assert fires(logged_in.get("/?range=6h").text) == fires(six)
    assert fires(logged_in.get("/").text) == "fires/s 10"
    week = logged_in.get("/?range=7d&live=1").text  # the live region keeps the range
    assert fires(week).startswith("fires/s ") and "a point per 85 minutes" in week
    seven_days_ago = (datetime.now(UTC) - timedelta(days=7)).strftime("%b %d")
    assert f'x="44" y="116">{seven_days_ago} ' in week
    for bad in ("2y", "<script>alert(1)</script>", "x" * 10_000):
        refused = logged_in.get("/", params={"range": bad})
        assert (refused.status_code, refused.text) == (400, "bad range: one of 1h, 6h, 24h, 7d")
