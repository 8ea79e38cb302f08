// Canvas drawing for the admin page: a Gantt of op bars, a TTFT scatter, time-series lines.
// Plain functions over plain data; no state here (ui.js owns it).
"use strict";

const CLASS_COLORS = { high: "#e4572e", normal: "#4c78a8", low: "#59a14f" };
const SERIES_COLORS = ["#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756", "#72b7b2",
                       "#9d755d", "#bab0ac"];
const AXIS = "#6b7785";
const GRID = "#e3e7ec";

// The canvas sized to its CSS box at the device pixel ratio; a 2D context in CSS pixels.
function fitCanvas(canvas) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth;
  const height = Number(canvas.getAttribute("height"));
  if (canvas.width !== Math.round(width * ratio)) {
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    canvas.style.height = height + "px";
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, width, height);
  ctx.font = "11px system-ui, sans-serif";
  return { ctx, width, height };
}

// Vertical grid lines and labels every `step` seconds back from `now`.
function timeAxis(ctx, box, now, windowS, step) {
  ctx.strokeStyle = GRID;
  ctx.fillStyle = AXIS;
  ctx.textAlign = "center";
  for (let back = 0; back <= windowS; back += step) {
    const x = box.x + box.w * (1 - back / windowS);
    ctx.beginPath();
    ctx.moveTo(x, box.y);
    ctx.lineTo(x, box.y + box.h);
    ctx.stroke();
    ctx.fillText(back === 0 ? "now" : `-${back}s`, x, box.y + box.h + 12);
  }
}

// The model of an op of a server of several models ("batch/layers[0:5]"), else null.
function modelOf(e) {
  const slash = (e.op || "").lastIndexOf("/");
  return slash > 0 ? e.op.slice(0, slash) : null;
}

// Op bars per device lane, filled by class; where ops of several models show, filled by
// model with a strip of their class on top. Returns {bars: [{x0, x1, y0, y1, event}],
// counts: {device: n}, models: [{name, color}]}.
function drawGantt(canvas, devices, events, now, windowS) {
  const { ctx, width, height } = fitCanvas(canvas);
  const box = { x: 70, y: 4, w: width - 80, h: height - 22 };
  timeAxis(ctx, box, now, windowS, windowS <= 10 ? 1 : 5);
  const lane = box.h / Math.max(devices.length, 1);
  const bars = [];
  const counts = {};
  devices.forEach((device, i) => {
    counts[device] = 0;
    ctx.fillStyle = AXIS;
    ctx.textAlign = "right";
    ctx.fillText(device, box.x - 8, box.y + lane * i + lane / 2 + 4);
  });
  const t0 = now - windowS;
  const names = [...new Set(events.map(modelOf).filter((m) => m !== null))].sort();
  const models = names.length > 1 ? names : [];
  const modelColor = (m) => SERIES_COLORS[models.indexOf(m) % SERIES_COLORS.length];
  for (const e of events) {
    const lane_i = devices.indexOf(e.device);
    if (lane_i < 0 || e.end < t0) continue;
    const x0 = box.x + box.w * (Math.max(e.start, t0) - t0) / windowS;
    const x1 = Math.max(x0 + 1, box.x + box.w * (Math.min(e.end, now) - t0) / windowS);
    const y0 = box.y + lane * lane_i + 3;
    const y1 = y0 + lane - 6;
    ctx.globalAlpha = e.role === "compute" || e.role === undefined ? 0.9 : 0.45;
    const byClass = CLASS_COLORS[e.class] || AXIS;
    const model = models.includes(modelOf(e)) ? modelOf(e) : null;
    const strip = model === null ? 0 : 3;  // px of class colour on top of a model's bar
    ctx.fillStyle = byClass;
    ctx.fillRect(x0, y0, x1 - x0, strip);
    ctx.fillStyle = model === null ? byClass : modelColor(model);
    ctx.fillRect(x0, y0 + strip, x1 - x0, y1 - y0 - strip);
    bars.push({ x0, x1, y0, y1, event: e });
    counts[e.device] += 1;
  }
  ctx.globalAlpha = 1;
  return { bars, counts, models: models.map((m) => ({ name: m, color: modelColor(m) })) };
}

// Dots of TTFT per tenant over time, each tenant's SLO as a dashed line; y scaled to fit both.
function drawTtft(canvas, points, slos, now, windowS) {
  const { ctx, width, height } = fitCanvas(canvas);
  const box = { x: 50, y: 8, w: width - 60, h: height - 26 };
  timeAxis(ctx, box, now, windowS, 10);
  const top = Math.max(0.05, ...points.map((p) => p.ttft_s), ...Object.values(slos)) * 1.15;
  yAxis(ctx, box, top, (v) => `${Math.round(v * 1000)} ms`);
  const tenants = [...new Set([...Object.keys(slos), ...points.map((p) => p.tenant)])].sort();
  const color = (t) => SERIES_COLORS[tenants.indexOf(t) % SERIES_COLORS.length];
  ctx.setLineDash([5, 4]);
  for (const [tenant, slo] of Object.entries(slos)) {
    const y = box.y + box.h * (1 - slo / top);
    ctx.strokeStyle = color(tenant);
    ctx.beginPath();
    ctx.moveTo(box.x, y);
    ctx.lineTo(box.x + box.w, y);
    ctx.stroke();
  }
  ctx.setLineDash([]);
  for (const p of points) {
    const x = box.x + box.w * (1 - (now - p.end) / windowS);
    const y = box.y + box.h * (1 - p.ttft_s / top);
    ctx.fillStyle = p.ttft_s > p.slo_s ? CLASS_COLORS.high : color(p.tenant);
    ctx.beginPath();
    ctx.arc(x, y, 3, 0, 2 * Math.PI);
    ctx.fill();
  }
  return tenants.map((t) => ({ name: t, color: color(t) }));
}

// Time series lines: series = [{name, points: [[t, v]], unit}], left axis 0..max.
function drawLines(canvas, series, now, windowS) {
  const { ctx, width, height } = fitCanvas(canvas);
  const box = { x: 50, y: 8, w: width - 60, h: height - 26 };
  timeAxis(ctx, box, now, windowS, 10);
  const top = Math.max(1, ...series.flatMap((s) => s.points.map((p) => p[1]))) * 1.15;
  yAxis(ctx, box, top, (v) => (v < 10 ? v.toFixed(1) : String(Math.round(v))));
  series.forEach((s, i) => {
    s.color = SERIES_COLORS[i % SERIES_COLORS.length];
    ctx.strokeStyle = s.color;
    ctx.lineWidth = 1.5;
    ctx.setLineDash(s.dashed ? [4, 3] : []);
    ctx.beginPath();
    s.points.forEach(([t, v], j) => {
      const x = box.x + box.w * (1 - (now - t) / windowS);
      const y = box.y + box.h * (1 - v / top);
      if (j === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    });
    ctx.stroke();
  });
  ctx.setLineDash([]);
  ctx.lineWidth = 1;
  return series.map((s) => ({ name: s.name, color: s.color }));
}

function yAxis(ctx, box, top, label) {
  ctx.fillStyle = AXIS;
  ctx.textAlign = "right";
  ctx.strokeStyle = GRID;
  for (let k = 0; k <= 4; k += 1) {
    const v = (top * k) / 4;
    const y = box.y + box.h * (1 - k / 4);
    ctx.beginPath();
    ctx.moveTo(box.x, y);
    ctx.lineTo(box.x + box.w, y);
    ctx.stroke();
    ctx.fillText(label(v), box.x - 6, y + 4);
  }
}

window.slicegateCharts = { drawGantt, drawTtft, drawLines, CLASS_COLORS, SERIES_COLORS };
