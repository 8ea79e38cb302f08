// The admin page: polls /admin/timeline, /admin/gmg and /metrics, keeps a short history,
// and redraws the charts (charts.js) about ten times a second so the timeline moves.
"use strict";

const GANTT_WINDOW_S = 10;
const HISTORY_S = 60;
const POLL_MS = 500;
const OVERLAP_S = 1; // re-ask for the last second: ops are recorded when they are collected
const KEY_STORE = "slicegate-admin-key";
const charts = window.slicegateCharts;

const state = {
  key: "", now: null, localAt: 0, since: null, events: [], seen: new Set(), requests: [],
  seenRequests: new Set(), devices: [], series: new Map(), slos: {}, batches: [], bars: [],
  stopped: false,
};
// What the browser test reads: polls done, draws done, op bars per device, newest op end,
// the middle of one drawn bar (canvas pixels).
window.slicegate = { polls: 0, renders: 0, counts: {}, lastEnd: 0, sampleBar: null };

class AuthError extends Error {}

function headers() {
  return state.key ? { Authorization: `Bearer ${state.key}` } : {};
}

async function get(path, as) {
  const response = await fetch(path, { headers: headers(), cache: "no-store" });
  if (response.status === 401 || response.status === 403) throw new AuthError(path);
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return as === "text" ? response.text() : response.json();
}

// Prometheus text -> [{name, labels, value}] (comments skipped).
function parseMetrics(text) {
  const out = [];
  for (const row of text.split("\n")) {
    if (!row || row.startsWith("#")) continue;
    const match = row.match(/^([^{\s]+)(?:\{(.*)\})?\s+(\S+)$/);
    if (!match) continue;
    const labels = {};
    for (const m of (match[2] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[m[1]] = m[2];
    out.push({ name: match[1], labels, value: Number(match[3]) });
  }
  return out;
}

function record(name, t, value, dashed) {
  if (!state.series.has(name)) state.series.set(name, { name, points: [], dashed });
  state.series.get(name).points.push([t, value]);
}

function absorbTimeline(timeline) {
  for (const e of timeline.events) {
    const id = `${e.device}|${e.start}|${e.op}`;
    if (state.seen.has(id)) continue;
    state.seen.add(id);
    state.events.push(e);
    window.slicegate.lastEnd = Math.max(window.slicegate.lastEnd, e.end);
  }
  for (const r of timeline.requests || []) {
    if (state.seenRequests.has(r.request_id)) continue;
    state.seenRequests.add(r.request_id);
    if (r.priority !== "low" && r.ttft_s !== null) state.requests.push(r);
  }
}

function absorbGmg(gmg, now) {
  const names = [];
  for (const d of gmg.devices || []) {
    const name = d.device || d.name;
    names.push(name);
    if (d.kv_blocks_total) record(`KV % ${name}`, now, (100 * d.kv_blocks_used) / d.kv_blocks_total, true);
    record(`queued ops ${name}`, now, (d.queue || []).length, false);
  }
  const fromEvents = state.events.map((e) => e.device);
  state.devices = [...new Set([...names, ...fromEvents])].sort();
}

function absorbMetrics(rows, now) {
  const waiting = { high: 0, normal: 0, low: 0 };
  const batches = new Map();
  for (const { name, labels, value } of rows) {
    if (name === "vllm:num_requests_waiting") waiting[labels.priority] += value;
    if (name === "slicegate_tenant_ttft_slo_seconds") state.slos[labels.tenant] = value;
    if (name === "slicegate_batch_requests") {
      const b = batches.get(labels.batch) || { id: labels.batch, tenant: labels.tenant,
                                               status: labels.status };
      b[labels.state] = value;
      batches.set(labels.batch, b);
    }
  }
  for (const [cls, n] of Object.entries(waiting)) record(`waiting ${cls}`, now, n, false);
  state.batches = [...batches.values()];
}

function forget(now) {
  const opsFrom = now - GANTT_WINDOW_S - OVERLAP_S;
  state.events = state.events.filter((e) => e.end >= opsFrom);
  state.seen = new Set(state.events.map((e) => `${e.device}|${e.start}|${e.op}`));
  state.requests = state.requests.filter((r) => r.end >= now - HISTORY_S);
  for (const s of state.series.values()) s.points = s.points.filter((p) => p[0] >= now - HISTORY_S);
}

async function poll() {
  const gmg = await get("/admin/gmg");
  const since = state.since === null ? gmg.now - GANTT_WINDOW_S : state.since;
  const [timeline, metrics] = await Promise.all([
    get(`/admin/timeline?since=${since}`), get("/metrics", "text")]);
  state.now = timeline.now;
  state.localAt = performance.now();
  state.since = timeline.now - OVERLAP_S;
  absorbTimeline(timeline);
  absorbGmg(gmg, timeline.now);
  absorbMetrics(parseMetrics(metrics), timeline.now);
  forget(timeline.now);
  window.slicegate.polls += 1;
}

function setStatus(text, ok) {
  const el = document.getElementById("status");
  el.textContent = text;
  el.className = `status ${ok ? "ok" : "bad"}`;
}

async function pollLoop() {
  while (!state.stopped) {
    try {
      await poll();
      setStatus(`live · ${state.devices.length} devices · polled every ${POLL_MS} ms`, true);
    } catch (err) {
      if (err instanceof AuthError) {
        askForKey(state.key ? "That key was refused: an admin key is needed." : "");
        return;
      }
      setStatus(`cannot reach the server: ${err.message}`, false);
    }
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
  }
}

function serverNow() {
  return state.now + Math.min((performance.now() - state.localAt) / 1000, 2);
}

function legend(id, items) {
  const el = document.getElementById(id);
  el.replaceChildren(...items.map(({ name, color }) => {
    const span = document.createElement("span");
    const sw = document.createElement("i");
    sw.className = "sw";
    sw.style.background = color;
    span.append(sw, name);
    return span;
  }));
}

function renderBatches() {
  const el = document.getElementById("batches");
  if (!state.batches.length) return;
  el.replaceChildren(...state.batches.map((b) => {
    const row = document.createElement("div");
    row.className = "batch";
    const label = document.createElement("span");
    label.textContent = `${b.id} · ${b.tenant} · ${b.status}`;
    const bar = document.createElement("div");
    bar.className = "bar";
    for (const part of ["completed", "failed"]) {
      const fill = document.createElement("div");
      fill.className = part === "completed" ? "done" : "failed";
      fill.style.width = `${b.total ? (100 * (b[part] || 0)) / b.total : 0}%`;
      bar.append(fill);
    }
    const counts = document.createElement("span");
    counts.textContent = `${b.completed || 0} done · ${b.failed || 0} failed · ${b.total || 0} in all`;
    row.append(label, bar, counts);
    return row;
  }));
}

let lastDraw = 0;
function render(t) {
  requestAnimationFrame(render);
  if (state.now === null || t - lastDraw < 100) return;
  lastDraw = t;
  const now = serverNow();
  const gantt = charts.drawGantt(document.getElementById("gantt"), state.devices, state.events,
                                 now, GANTT_WINDOW_S);
  state.bars = gantt.bars;
  legend("gantt-legend", gantt.models);
  window.slicegate.counts = gantt.counts;
  const last = gantt.bars[gantt.bars.length - 1];
  window.slicegate.sampleBar = last ? { x: (last.x0 + last.x1) / 2, y: (last.y0 + last.y1) / 2 } : null;
  legend("ttft-legend", charts.drawTtft(document.getElementById("ttft"), state.requests,
                                        state.slos, now, HISTORY_S));
  legend("queues-legend", charts.drawLines(document.getElementById("queues"),
                                           [...state.series.values()], now, HISTORY_S));
  renderBatches();
  window.slicegate.renders += 1;
}

function describe(e) {
  const ms = ((e.end - e.start) * 1000).toFixed(2);
  const who = (e.tenants || []).join(", ") || "?";
  const size = e.num_tokens !== undefined ? ` · ${e.num_seqs} seqs · ${e.num_tokens} tokens` : "";
  return `${e.device}  ${e.op}${e.role ? ` (${e.role})` : ""}\nclass ${e.class} · tenant ${who}\n${ms} ms${size}`;
}

function onHover(event) {
  const canvas = event.currentTarget;
  const rect = canvas.getBoundingClientRect();
  const x = event.clientX - rect.left;
  const y = event.clientY - rect.top;
  const bar = state.bars.find((b) => x >= b.x0 - 1 && x <= b.x1 + 1 && y >= b.y0 && y <= b.y1);
  const tip = document.getElementById("tip");
  tip.hidden = !bar;
  if (!bar) return;
  tip.textContent = describe(bar.event);
  tip.style.left = `${event.clientX + 12}px`;
  tip.style.top = `${event.clientY + 12}px`;
}

function askForKey(message) {
  state.stopped = true;
  setStatus("admin key needed", false);
  const form = document.getElementById("keyform");
  form.hidden = false;
  document.getElementById("keyerror").textContent = message;
}

function start() {
  const match = location.hash.match(/key=([^&]+)/);
  if (match) {
    sessionStorage.setItem(KEY_STORE, decodeURIComponent(match[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
  state.key = sessionStorage.getItem(KEY_STORE) || "";
  document.getElementById("keyform").addEventListener("submit", (event) => {
    event.preventDefault();
    state.key = document.getElementById("key").value.trim();
    sessionStorage.setItem(KEY_STORE, state.key);
    document.getElementById("keyform").hidden = true;
    state.stopped = false;
    pollLoop();
  });
  const gantt = document.getElementById("gantt");
  gantt.addEventListener("mousemove", onHover);
  gantt.addEventListener("mouseleave", () => { document.getElementById("tip").hidden = true; });
  pollLoop();
  requestAnimationFrame(render);
}

start();
