"""A grouped bar chart of speed-ups as a self-contained SVG file (no plotting package:
the benchmarks run on GPU machines with only torch installed).

    svg = speedup_svg("Decoder layer, H100", ["1", "16", "64"], {"ours W4A16": [2.5, 1.9, 1.6]})

One group of bars per x label (a batch size), one bar per series in the legend's
order, each labelled with its value; a dashed line marks 1.0x (the baseline's speed).
"""

from __future__ import annotations

from xml.sax.saxutils import escape

# Colour-blind-safe (Okabe-Ito), in series order.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442")
WIDTH, HEIGHT = 860, 400
LEFT, RIGHT, TOP, BOTTOM = 60, 170, 50, 50  # margins: axis labels, legend, title


def speedup_svg(
    title: str, groups: list[str], series: dict[str, list[float]], x_label: str = "batch"
) -> str:
    """The SVG text of ``series`` (name -> one speed-up per group) as bars over
    ``groups``, titled ``title``; the y axis runs from 0 to the largest value rounded
    up to a half. ValueError where a series has not one value per group, or a value is
    not a positive finite number."""
    for name, values in series.items():
        if len(values) != len(groups):
            raise ValueError(f"series {name!r} has {len(values)} values for {len(groups)} groups")
        if not all(0 < v < float("inf") for v in values):
            raise ValueError(f"series {name!r}: speed-ups must be positive and finite: {values}")
    top = max([1.0, *(v for values in series.values() for v in values)])
    y_max = -(-top * 2 // 1) / 2  # up to the next half
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def y(value: float) -> float:
        return TOP + plot_h * (1 - value / y_max)

    group_w = plot_w / len(groups)
    bar_w = group_w * 0.8 / max(1, len(series))
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{WIDTH / 2:.1f}" y="24" text-anchor="middle" font-size="14">'
        f"{escape(title)}</text>",
    ]
    ticks = int(y_max * 2)
    for i in range(ticks + 1):  # a grid line and label every 0.5x
        value = i / 2
        parts.append(
            f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(value):.1f}" y2="{y(value):.1f}" '
            f'stroke="#ddd"/><text x="{LEFT - 6}" y="{y(value) + 4:.1f}" '
            f'text-anchor="end">{value:g}x</text>'
        )
    for g, group in enumerate(groups):
        x0 = LEFT + g * group_w + group_w * 0.1
        for s, (name, values) in enumerate(series.items()):
            x = x0 + s * bar_w
            parts.append(
                f'<rect x="{x:.1f}" y="{y(values[g]):.1f}" width="{bar_w * 0.92:.1f}" '
                f'height="{y(0) - y(values[g]):.1f}" fill="{PALETTE[s % len(PALETTE)]}">'
                f"<title>{escape(name)}, {escape(x_label)} {escape(group)}: "
                f"{values[g]:.2f}x</title></rect>"
                f'<text x="{x + bar_w * 0.46:.1f}" y="{y(values[g]) - 3:.1f}" '
                f'text-anchor="middle" font-size="10">{values[g]:.2f}</text>'
            )
        parts.append(
            f'<text x="{LEFT + (g + 0.5) * group_w:.1f}" y="{TOP + plot_h + 18}" '
            f'text-anchor="middle">{escape(x_label)} {escape(group)}</text>'
        )
    parts.append(
        f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(1):.1f}" y2="{y(1):.1f}" '
        'stroke="black" stroke-dasharray="4 3"/>'
    )
    for s, name in enumerate(series):
        legend_y = TOP + 8 + 20 * s
        parts.append(
            f'<rect x="{WIDTH - RIGHT + 16}" y="{legend_y - 10}" width="12" height="12" '
            f'fill="{PALETTE[s % len(PALETTE)]}"/><text x="{WIDTH - RIGHT + 34}" '
            f'y="{legend_y}">{escape(name)}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
