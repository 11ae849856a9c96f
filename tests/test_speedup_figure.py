"""benchmarks/speedup_figure.py, the decoder-layer benchmark's SVG bar chart: well-formed
SVG, one bar per (group, series) whose height is its value on the axis, and refusals."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from speedup_figure import speedup_svg

SVG = "{http://www.w3.org/2000/svg}"
SERIES = {"ours <W4A16>": [2.51, 1.95, 1.64], "ours W8A8": [1.82, 1.89, 0.7]}


def _bars(svg: str) -> list[tuple[str, float, float]]:
    """(tooltip, top y, height) of each bar: the rects that carry a title."""
    root = ET.fromstring(svg)
    return [
        (rect.find(f"{SVG}title").text, float(rect.get("y")), float(rect.get("height")))
        for rect in root.iter(f"{SVG}rect")
        if rect.find(f"{SVG}title") is not None
    ]


def test_each_bar_stands_for_its_value():
    svg = speedup_svg("layer & co", ["1", "16", "64"], SERIES)
    bars = _bars(svg)
    assert [title for title, _, _ in bars] == [
        "ours <W4A16>, batch 1: 2.51x",
        "ours W8A8, batch 1: 1.82x",
        "ours <W4A16>, batch 16: 1.95x",
        "ours W8A8, batch 16: 1.89x",
        "ours <W4A16>, batch 64: 1.64x",
        "ours W8A8, batch 64: 0.70x",
    ]
    values = [v for g in range(3) for v in (SERIES["ours <W4A16>"][g], SERIES["ours W8A8"][g])]
    # Heights are proportional to the values and all bars stand on one axis.
    per_unit = bars[0][2] / values[0]
    for (_, top, height), value in zip(bars, values, strict=True):
        assert height == pytest.approx(per_unit * value, abs=0.15)
        assert top + height == pytest.approx(bars[0][1] + bars[0][2], abs=0.15)
    root = ET.fromstring(svg)
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "layer &amp; co" not in texts and "layer & co" in texts  # escaped once, read back
    assert "3x" in texts and "0x" in texts  # the axis reaches past the largest value


@pytest.mark.parametrize(
    ("series", "message"),
    [
        ({"a": [1.0, 2.0]}, "has 2 values for 3 groups"),
        ({"a": [1.0, 0.0, 2.0]}, "positive and finite"),
        ({"a": [1.0, float("nan"), 2.0]}, "positive and finite"),
        ({"a": [1.0, float("inf"), 2.0]}, "positive and finite"),
    ],
)
def test_values_that_cannot_be_drawn_are_refused(series, message):
    with pytest.raises(ValueError, match=message):
        speedup_svg("t", ["1", "16", "64"], series)
