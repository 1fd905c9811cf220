"""Line charts as inline SVG, drawn on the server: no script, no library, and the CSP allows them
(an inline <svg> is markup, not an image fetched from anywhere)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from markupsafe import Markup, escape

from worker.ops.fleet_stats import Minute

W, H, PAD_L, PAD_B, PAD_T = 360, 120, 44, 18, 8


@dataclass(frozen=True, slots=True)
class Line:
    name: str
    points: list[tuple[datetime, float | None]]
    css: str  # a class of base.html's stylesheet (the colours follow the page's light or dark mode)


def _fmt(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"
    return f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"


def chart(
    title: str, unit: str, lines: list[Line], chart_id: str, frame: tuple[datetime, datetime] | None = None
) -> Markup:
    """An SVG of `lines` over their times (and over all of `frame`, the range asked for, so a gap in
    the data shows as one), with the y range's top and the latest values named."""
    times = [t for line in lines for t, v in line.points if v is not None]
    values = [v for line in lines for _, v in line.points if v is not None]
    latest = ", ".join(
        f"{line.name} {_fmt(next(v for _, v in reversed(line.points) if v is not None), unit)}"
        for line in lines
        if any(v is not None for _, v in line.points)
    )
    head = Markup('<figure class="chart" id="{}"><figcaption>{} <small>{}</small></figcaption>').format(
        chart_id, title, latest or "no data yet"
    )
    svg = [f'<svg viewBox="0 0 {W} {H}" role="img" aria-label="{escape(title)}">']
    svg.append(f'<line class="axis" x1="{PAD_L}" y1="{H - PAD_B}" x2="{W}" y2="{H - PAD_B}"/>')
    if times:
        ends = list(frame) if frame else []
        t0, t1 = min([*times, *ends]), max([*times, *ends])
        span = max((t1 - t0).total_seconds(), 60.0)
        top = max(values) * 1.1 or 1.0

        def xy(t: datetime, v: float) -> str:
            x = PAD_L + (W - PAD_L - 4) * (t - t0).total_seconds() / span
            y = H - PAD_B - (H - PAD_B - PAD_T) * v / top
            return f"{x:.1f},{y:.1f}"

        svg.append(
            f'<text class="tick" x="{PAD_L - 4}" y="{PAD_T + 8}" text-anchor="end">{_fmt(top, unit)}</text>'
        )
        svg.append(f'<text class="tick" x="{PAD_L - 4}" y="{H - PAD_B}" text-anchor="end">0</text>')
        when = "%H:%M" if span <= 86_400 else "%b %d %H:%M"  # a week's ends: which days
        svg.append(f'<text class="tick" x="{PAD_L}" y="{H - 4}">{t0.strftime(when)}Z</text>')
        svg.append(f'<text class="tick" x="{W}" y="{H - 4}" text-anchor="end">{t1.strftime(when)}Z</text>')
        for line in lines:
            pts = [xy(t, v) for t, v in line.points if v is not None]
            if len(pts) == 1:
                x, y = pts[0].split(",")
                svg.append(f'<circle class="{line.css}" cx="{x}" cy="{y}" r="2.5"/>')
            elif pts:
                svg.append(f'<polyline class="{line.css}" points="{" ".join(pts)}"/>')
    svg.append("</svg></figure>")
    return head + Markup("".join(svg))


def overview_charts(minutes: list[Minute], frame: tuple[datetime, datetime] | None = None) -> list[Markup]:
    def of(get: str) -> list[tuple[datetime, float | None]]:
        return [(m.at, getattr(m, get)) for m in minutes]

    return [
        chart("Fires per second", "", [Line("fires/s", of("fires_per_s"), "l1")], "chart-fires", frame),
        chart(
            "Lateness",
            "s",
            [Line("p50", of("p50_s"), "l1"), Line("p99", of("p99_s"), "l2")],
            "chart-lateness",
            frame,
        ),
        chart("Overdue, unclaimed", "", [Line("overdue", of("overdue"), "l2")], "chart-overdue", frame),
        chart(
            "Rejected commands a minute",
            "",
            [Line("rejected", of("rejected"), "l2")],
            "chart-rejected",
            frame,
        ),
    ]
