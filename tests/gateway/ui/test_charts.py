"""/admin/ui's Gantt (charts.js) in Debian's chromium: bars coloured by class, and by model
where ops of several models show (docs/models.md), read back from the canvas' pixels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import sync_playwright

from gateway.ui.browser import CHROMIUM_ARGS, find_chromium

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary "
                                "(./slicegate.sh test installs Debian's chromium)")
CHARTS = (Path(__file__).resolve().parents[3] / "gateway" / "ui" / "static" /
          "charts.js").read_text()
DRAW = """(events) => {
  const charts = window.slicegateCharts;
  const canvas = document.getElementById("gantt");
  const out = charts.drawGantt(canvas, ["cpu:0", "cpu:1"], events, 10, 10);
  const ctx = canvas.getContext("2d");
  const ratio = window.devicePixelRatio || 1;
  const pixel = (x, y) => Array.from(ctx.getImageData(Math.round(x * ratio),
                                                      Math.round(y * ratio), 1, 1).data);
  return { models: out.models, classes: charts.CLASS_COLORS, series: charts.SERIES_COLORS,
           bars: out.bars.map((b) => ({ op: b.event.op, top: pixel((b.x0 + b.x1) / 2, b.y0 + 1),
                                        body: pixel((b.x0 + b.x1) / 2, (b.y0 + b.y1) / 2) })) };
}"""


def _event(op: str, device: str, cls: str, start: float) -> dict[str, Any]:
    return {"op": op, "device": device, "class": cls, "role": "compute", "start": start,
            "end": start + 3}


def _rgb(color: str) -> list[int]:
    return [int(color[i:i + 2], 16) for i in (1, 3, 5)]


def _draw(events: list[dict[str, Any]]) -> dict[str, Any]:
    assert CHROMIUM is not None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS))
        page = browser.new_page(viewport={"width": 800, "height": 300})
        page.set_content('<canvas id="gantt" height="180" style="width: 700px"></canvas>')
        page.add_script_tag(content=CHARTS)
        out: dict[str, Any] = page.evaluate(DRAW, events)
        browser.close()
    return out


def _close(pixel: list[int], color: str) -> bool:
    """The pixel's RGB is `color` (bars are drawn at 0.9 alpha on a clear canvas)."""
    return all(abs(p - c) <= 2 for p, c in zip(pixel[:3], _rgb(color), strict=True))


def test_ops_of_two_models_are_coloured_by_model_with_their_class_on_top() -> None:
    out = _draw([_event("chat/layers[0:5]", "cpu:0", "high", 1),
                 _event("batch/layers[0:5]", "cpu:1", "low", 5)])
    series, classes = out["series"], out["classes"]
    assert out["models"] == [{"name": "batch", "color": series[0]},
                             {"name": "chat", "color": series[1]}]
    chat, batch = out["bars"]
    assert _close(chat["body"], series[1]) and _close(chat["top"], classes["high"])
    assert _close(batch["body"], series[0]) and _close(batch["top"], classes["low"])


def test_ops_of_one_model_are_coloured_by_class() -> None:
    out = _draw([_event("layers[0:5]", "cpu:0", "high", 1),
                 _event("head", "cpu:1", "low", 5)])
    assert out["models"] == []
    high, low = out["bars"]
    assert _close(high["body"], out["classes"]["high"]) and _close(high["top"],
                                                                    out["classes"]["high"])
    assert _close(low["body"], out["classes"]["low"])
