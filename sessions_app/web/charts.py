"""Server-side SVG charts for the dashboard: plain markup built in Python,
no JavaScript and nothing fetched from a CDN.

A day whose usage includes unpriced entries gets a marker above its bar (and
says so in its tooltip and the table next to the chart): an unknown price is
never drawn as a $0 bar without comment.
"""

from __future__ import annotations

from decimal import Decimal

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from sessions_app.services.usage import DayPoint, format_cost

WIDTH, HEIGHT = 720, 220
LEFT, RIGHT, TOP, BOTTOM = 64, 12, 20, 28


def cost_chart(points: list[DayPoint], *, title: str = "Cost per day") -> SafeString:
    """A bar chart of cost per day (oldest first) as an inline <svg>."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    top = max((p.cost for p in points), default=Decimal(0))
    scale = top if top > 0 else Decimal(1)
    slot = plot_w / max(len(points), 1)
    bar_w = max(slot * 0.7, 1.0)
    parts = [
        f'<svg class="cost-chart" viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" role="img" '
        f'aria-labelledby="cost-chart-title" xmlns="http://www.w3.org/2000/svg">',
        f'<title id="cost-chart-title">{escape(title)}</title>',
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH - RIGHT}" y2="{TOP + plot_h}" class="axis"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" class="axis"/>',
        f'<text x="{LEFT - 6}" y="{TOP + 4}" text-anchor="end" class="tick">{escape(f"${top:.4f}")}</text>',
        f'<text x="{LEFT - 6}" y="{TOP + plot_h}" text-anchor="end" class="tick">$0</text>',
    ]
    for i, p in enumerate(points):
        x = LEFT + i * slot + (slot - bar_w) / 2
        h = float(p.cost / scale) * plot_h if p.cost > 0 else 0.0
        y = TOP + plot_h - h
        label = f"{p.day.isoformat()}: {format_cost(p.cost, p.unpriced)}, {p.steps} steps"
        parts.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}" class="bar">'
            f"<title>{escape(label)}</title></rect>"
        )
        if p.unpriced:
            cx = x + bar_w / 2
            parts.append(
                f'<circle cx="{cx:.1f}" cy="{max(y - 6, 6):.1f}" r="3.5" class="unpriced">'
                f"<title>{escape(label)}</title></circle>"
            )
    if points:
        first, last = points[0].day.isoformat(), points[-1].day.isoformat()
        parts.append(f'<text x="{LEFT}" y="{HEIGHT - 8}" class="tick">{first}</text>')
        parts.append(f'<text x="{WIDTH - RIGHT}" y="{HEIGHT - 8}" text-anchor="end" class="tick">{last}</text>')
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - every interpolated text is escaped above
