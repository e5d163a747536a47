// Orrery dashboard: polls the hub's JSON API (/api/series, /api/query, /api/actors) and draws the
// Pretraining, Reward, Rollout, Learner, Routing and Fleet panels. Metric names are agreed in
// docs/dashboard.md; a '*' in a chart's series matches one '/'-separated segment.
import uPlot from "uplot";

const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04",
  "#db2777", "#4b5563", "#65a30d"];
const REFRESH_MS = 2000;
const FLEET_STATES = ["starting", "running", "restarting", "stopped", "failed"];

// Each chart: panel, title, the series it draws (names or patterns), and optionally kind "bars"
// (the latest array as a histogram).
const CHARTS = [
  { panel: "pretrain", id: "pretrain-loss", title: "Loss: training and held-out",
    series: ["loss", "eval_loss"] },
  { panel: "pretrain", id: "pretrain-ctx", title: "Context length of the stage (tokens)",
    series: ["seq_len"] },
  { panel: "pretrain", id: "pretrain-lr", title: "Learning rate", series: ["lr"] },
  { panel: "pretrain", id: "pretrain-tps", title: "Training throughput (tokens/s)",
    series: ["tokens_per_second"] },
  { panel: "pretrain", id: "pretrain-grad", title: "Gradient norm", series: ["grad_norm"] },
  { panel: "reward", id: "reward-mean", title: "Mean reward (all and per environment)",
    series: ["reward/mean", "reward/env/*/mean"] },
  { panel: "reward", id: "reward-pass", title: "Pass rate (all and per environment)",
    series: ["reward/pass_rate", "reward/env/*/pass_rate"] },
  { panel: "reward", id: "reward-pct", title: "Reward percentiles (p10, p50, p90)",
    series: ["reward/p10", "reward/p50", "reward/p90"] },
  { panel: "rollout", id: "rollout-len", title: "Episode length (tokens)",
    series: ["rollout/episode_length_tokens"] },
  { panel: "rollout", id: "rollout-tools", title: "Tool calls per episode",
    series: ["rollout/tool_calls_per_episode"] },
  { panel: "rollout", id: "rollout-toolerr", title: "Tool error ratio",
    series: ["rollout/tool_error_ratio"] },
  { panel: "rollout", id: "rollout-envfaults",
    title: "Environment faults (episodes, cumulative): tool errors, timeouts, lost env workers",
    series: ["rollout/env_tool_errors_total", "rollout/env_timeouts_total",
      "rollout/env_lost_total"] },
  { panel: "rollout", id: "rollout-sandbox", title: "Sandbox latency p50 / p99 (s)",
    series: ["rollout/sandbox_latency_p50_seconds", "rollout/sandbox_latency_p99_seconds"] },
  { panel: "rollout", id: "rollout-tps", title: "Generation throughput (tokens/s)",
    series: ["rollout/generation_tokens_per_second"] },
  { panel: "learner", id: "learner-loss", title: "Loss", series: ["learner/loss"] },
  { panel: "learner", id: "learner-is", title: "Importance weights: mean and ESS ratio",
    series: ["learner/is_weight_mean", "learner/is_weight_ess_ratio"] },
  { panel: "learner", id: "learner-clip", title: "Clip ratio", series: ["learner/clip_ratio"] },
  { panel: "learner", id: "learner-entropy", title: "Policy entropy (nats)",
    series: ["learner/entropy"] },
  { panel: "learner", id: "learner-grad", title: "Gradient norm", series: ["learner/grad_norm"] },
  { panel: "learner", id: "learner-stale", title: "Staleness: count by versions behind (latest step)",
    series: ["learner/staleness_by_version"], kind: "bars" },
  { panel: "learner", id: "learner-sync", title: "Weight sync time by phase (s)",
    series: ["learner/weight_sync_seconds/phase/*"] },
  { panel: "routing", id: "routing-violation", title: "Max load violation (max load / mean - 1)",
    series: ["routing/max_load_violation"] },
  { panel: "routing", id: "routing-dead", title: "Dead experts", series: ["routing/dead_experts"] },
  { panel: "routing", id: "routing-entropy", title: "Router entropy (nats)",
    series: ["routing/router_entropy"] },
  { panel: "routing", id: "routing-agree", title: "Rollout vs learner routing agreement",
    series: ["routing/agreement_ratio"] },
  { panel: "fleet", id: "fleet-replay-size", title: "Replay table size (items)",
    series: ["replay/table/*/size_items"] },
  { panel: "fleet", id: "fleet-replay-blocked", title: "Rate-limiter blocked time (s, cumulative)",
    series: ["replay/table/*/blocked_seconds_total"] },
  { panel: "fleet", id: "fleet-restarts", title: "Actor restarts (cumulative)",
    series: ["fleet/restarts_total"] },
];
const HEATMAPS = [
  { el: "load-heatmap", prefix: "routing/expert_load/layer", center: 1, span: 1 },
  { el: "bias-heatmap", prefix: "routing/qb_bias/layer", center: 0, span: null },
];
const FLEET_NAMES = ["fleet/state", "fleet/restarts_total", "fleet/heartbeat_age_seconds"];
const REPLAY_FIELDS = ["size_items", "inserts_per_second", "samples_per_second",
  "blocked_seconds_total"];

const state = {
  seq: 0,                // last sequence number received
  names: new Set(),      // series names known to the server
  data: new Map(),       // name -> Map(source -> {seq:[], time:[], step:[], values:[]})
  actors: [],
  charts: new Map(),     // chart id -> {plot, def, key, points}
  info: null,
  lastError: "",
};
// Read by tests/browser: what each chart and heatmap drew.
window.orreryDashboard = { ready: false, charts: {}, heatmaps: {}, errors: [] };

function matches(pattern, name) {
  if (!pattern.includes("*")) return pattern === name;
  const p = pattern.split("/"), n = name.split("/");
  return p.length === n.length && p.every((seg, i) => seg === "*" || seg === n[i]);
}

function chartNames(def) {
  const out = [];
  for (const pattern of def.series) {
    for (const name of [...state.names].sort()) if (matches(pattern, name)) out.push(name);
  }
  return out;
}

function neededNames() {
  const out = new Set(FLEET_NAMES);
  for (const def of CHARTS) chartNames(def).forEach((n) => out.add(n));
  for (const name of state.names) {
    if (HEATMAPS.some((h) => name.startsWith(h.prefix))) out.add(name);
    if (name.startsWith("replay/table/")) out.add(name);
  }
  return [...out].filter((n) => state.names.has(n));
}

async function getJson(url) {
  const res = await fetch(url, { cache: "no-store" });
  if (!res.ok) throw new Error(`${url}: HTTP ${res.status}`);
  return res.json();
}

function merge(series) {
  for (const [name, perSource] of Object.entries(series)) {
    if (!state.data.has(name)) state.data.set(name, new Map());
    const bySource = state.data.get(name);
    for (const s of perSource) {
      let d = bySource.get(s.source);
      if (!d) { d = { seq: [], time: [], step: [], values: [] }; bySource.set(s.source, d); }
      for (let i = 0; i < s.seq.length; i++) {
        d.seq.push(s.seq[i]); d.time.push(s.time[i]); d.step.push(s.step[i]);
        d.values.push(s.values[i]);
      }
    }
  }
}

async function query(names, after, until) {
  for (let i = 0; i < names.length; i += 40) {
    const params = new URLSearchParams();
    names.slice(i, i + 40).forEach((n) => params.append("name", n));
    params.set("after", String(after));
    params.set("until", String(until));
    merge((await getJson(`/api/query?${params}`)).series);
  }
}

async function refresh() {
  const [info, series, actors] = await Promise.all([
    getJson("/api/info"), getJson("/api/series"), getJson("/api/actors")]);
  state.info = info;
  state.actors = actors;
  const fresh = [];
  for (const s of series) if (!state.names.has(s.name)) { state.names.add(s.name); fresh.push(s.name); }
  const needed = new Set(neededNames());
  const freshNeeded = fresh.filter((n) => needed.has(n));
  const old = [...needed].filter((n) => !freshNeeded.includes(n));
  // Points of new series from the start, of known ones since the last refresh.
  const target = info.last_seq;
  if (freshNeeded.length) await query(freshNeeded, 0, target);
  if (old.length && target > state.seq) await query(old, state.seq, target);
  state.seq = Math.max(state.seq, target);
  render();
}

function xOf(d, i) {
  return document.getElementById("x-axis").value === "time" ? d.time[i] : d.step[i];
}

// Aligns the (name, source) lines of a chart on one sorted x axis (uPlot's data layout).
function alignedData(lines) {
  const xs = new Set();
  const maps = lines.map((line) => {
    const m = new Map();
    for (let i = 0; i < line.d.step.length; i++) {
      const x = xOf(line.d, i), v = line.d.values[i];
      m.set(x, Array.isArray(v) ? v[0] : v);
      xs.add(x);
    }
    return m;
  });
  const x = [...xs].sort((a, b) => a - b);
  return [x, ...maps.map((m) => x.map((v) => (m.has(v) ? m.get(v) : null)))];
}

function shortLabel(def, name, source, manySources) {
  let label = name;
  const star = def.series.find((p) => p.includes("*") && matches(p, name));
  if (star) {
    const p = star.split("/"), n = name.split("/");
    label = n.filter((_, i) => p[i] === "*").join("/");
  } else if (def.series.length > 1) {
    label = name.split("/").pop();
  } else {
    label = "";
  }
  if (manySources || !label) label = label ? `${label} @ ${source}` : source;
  return label;
}

function cardFor(def) {
  let card = document.getElementById(`chart-${def.id}`);
  if (!card) {
    card = document.createElement("div");
    card.className = "chart-card";
    card.id = `chart-${def.id}`;
    card.dataset.chart = def.id;
    card.innerHTML = `<h3></h3><div class="plot"><div class="empty">no data yet</div></div>`;
    card.querySelector("h3").textContent = def.title;
    document.querySelector(`[data-panel="${def.panel}"] > .charts`).appendChild(card);
  }
  return card;
}

function drawChart(def) {
  const card = cardFor(def);
  const plotEl = card.querySelector(".plot");
  const lines = [];
  const names = chartNames(def);
  for (const name of names) {
    const bySource = state.data.get(name);
    if (!bySource) continue;
    for (const [source, d] of [...bySource.entries()].sort()) lines.push({ name, source, d });
  }
  const points = lines.reduce((n, l) => n + l.d.step.length, 0);
  let data, seriesOpts, xTime = false;
  if (def.kind === "bars") {
    // The latest histogram of each source, x = bucket index.
    const latest = lines.map((l) => l.d.values[l.d.values.length - 1] || []);
    const n = Math.max(0, ...latest.map((v) => v.length));
    data = [Array.from({ length: n }, (_, i) => i), ...latest.map((v) => Array.from({ length: n }, (_, i) => v[i] ?? null))];
    seriesOpts = lines.map((l, i) => ({ label: l.source, stroke: PALETTE[i % PALETTE.length],
      fill: PALETTE[i % PALETTE.length] + "66", paths: uPlot.paths.bars({ size: [0.8, 40] }) }));
  } else {
    data = alignedData(lines);
    xTime = document.getElementById("x-axis").value === "time";
    const manySources = new Set(lines.map((l) => l.source)).size > 1;
    seriesOpts = lines.map((l, i) => ({ label: shortLabel(def, l.name, l.source, manySources),
      stroke: PALETTE[i % PALETTE.length], width: 1.5, spanGaps: true, points: { show: false } }));
  }
  const key = `${xTime}|${def.kind || "line"}|${seriesOpts.map((s) => s.label).join(",")}`;
  window.orreryDashboard.charts[def.id] = { panel: def.panel, points, lines: lines.length };
  if (points === 0) return;
  const width = Math.max(300, plotEl.clientWidth || card.clientWidth - 16);
  let entry = state.charts.get(def.id);
  if (entry && entry.key === key) {
    entry.plot.setData(data);
    return;
  }
  if (entry) entry.plot.destroy();
  plotEl.innerHTML = "";
  const plot = new uPlot({
    width, height: 220,
    scales: { x: { time: xTime } },
    axes: [{ label: def.kind === "bars" ? "versions behind" : (xTime ? "" : "step") }, {}],
    legend: { live: true },
    cursor: { drag: { x: true, y: false } },
    series: [{ label: def.kind === "bars" ? "bucket" : (xTime ? "time" : "step") }, ...seriesOpts],
  }, data, plotEl);
  state.charts.set(def.id, { plot, key });
}

function heatColor(v, center, span) {
  // Diverging: blue below center, white at center, red above; |v - center| >= span saturates.
  const t = Math.max(-1, Math.min(1, (v - center) / span));
  const a = Math.round(255 * (1 - Math.abs(t)));
  return t >= 0 ? `rgb(255,${a},${a})` : `rgb(${a},${a},255)`;
}

function layerSeries(prefix) {
  const layers = [];
  for (const [name, bySource] of state.data) {
    if (!name.startsWith(prefix)) continue;
    const layer = Number(name.slice(prefix.length));
    if (Number.isInteger(layer)) layers.push({ layer, bySource });
  }
  return layers.sort((a, b) => a.layer - b.layer);
}

function drawHeatmaps() {
  const sourceSel = document.getElementById("routing-source");
  const slider = document.getElementById("routing-step");
  const loads = layerSeries(HEATMAPS[0].prefix);
  const sources = [...new Set(loads.flatMap((l) => [...l.bySource.keys()]))].sort();
  if (sourceSel.options.length !== sources.length) {
    const keep = sourceSel.value;
    sourceSel.innerHTML = sources.map((s) => `<option>${s}</option>`).join("");
    if (sources.includes(keep)) sourceSel.value = keep;
  }
  const source = sourceSel.value || sources[0];
  // Steps come from the first layer's load series; the slider follows the newest step unless the
  // user moved it back.
  const first = loads.length ? loads[0].bySource.get(source) : null;
  const steps = first ? first.step : [];
  const following = Number(slider.value) >= Number(slider.max);
  slider.max = String(Math.max(0, steps.length - 1));
  if (following) slider.value = slider.max;
  const step = steps[Number(slider.value)];
  document.getElementById("routing-step-label").textContent = step === undefined ? "" : String(step);

  for (const h of HEATMAPS) {
    const el = document.getElementById(h.el);
    const layers = layerSeries(h.prefix);
    const rows = layers.map(({ layer, bySource }) => {
      const d = bySource.get(source);
      if (!d) return { layer, values: [] };
      const i = d.step.lastIndexOf(step);
      return { layer, values: i >= 0 ? d.values[i] : d.values[d.values.length - 1] };
    });
    const experts = Math.max(0, ...rows.map((r) => r.values.length));
    let span = h.span;
    if (span === null) span = Math.max(1e-9, ...rows.flatMap((r) => r.values.map((v) => Math.abs(v - h.center))));
    el.style.gridTemplateColumns = `auto repeat(${experts}, minmax(6px, 1fr))`;
    const parts = [];
    for (const r of rows) {
      parts.push(`<div class="row-label">layer ${r.layer}</div>`);
      for (let e = 0; e < experts; e++) {
        const v = r.values[e];
        const color = v === undefined ? "#eee" : heatColor(v, h.center, span);
        const title = v === undefined ? "" : `layer ${r.layer}, expert ${e}: ${v.toFixed(3)}`;
        parts.push(`<div class="cell" data-layer="${r.layer}" data-expert="${e}" style="background:${color}" title="${title}"></div>`);
      }
    }
    el.innerHTML = parts.join("");
    window.orreryDashboard.heatmaps[h.el] = { layers: rows.length, experts };
  }
  document.getElementById("heatmap-legend").textContent =
    "blue: below the mean load (or a negative bias), white: balanced, red: above; hover a cell for its value";
}

function latestOf(name, source) {
  const d = state.data.get(name)?.get(source);
  return d && d.values.length ? d.values[d.values.length - 1] : undefined;
}

function ageText(seconds) {
  if (seconds < 90) return `${seconds.toFixed(0)} s ago`;
  if (seconds < 5400) return `${(seconds / 60).toFixed(0)} min ago`;
  return `${(seconds / 3600).toFixed(1)} h ago`;
}

// The server's clock and the time of the run's last record; a run silent for a minute has
// finished (a recorded run, or a launch that stopped).
function runTimes() {
  const now = state.info ? state.info.now : Date.now() / 1000;
  const runEnd = Math.max(0, ...state.actors.map((a) => a.last_time));
  return { now, runEnd, finished: now - runEnd > 60 };
}

// When the actor was last heard of. The launcher's fleet records come under the actor's own name
// and carry its heartbeat age; their own time is the launcher's, so a silent actor would look live.
function lastHeardOf(a) {
  const d = state.data.get("fleet/heartbeat_age_seconds")?.get(a.source);
  if (!d || !d.values.length || d.values[d.values.length - 1] < 0) return a.last_time;
  return d.time[d.time.length - 1] - d.values[d.values.length - 1];
}

function drawFleet() {
  const { now, runEnd, finished } = runTimes();
  const rows = state.actors.map((a) => {
    const code = latestOf("fleet/state", a.source);
    const restarts = latestOf("fleet/restarts_total", a.source);
    let status = code === undefined ? "reporting" : (FLEET_STATES[code] || `state ${code}`);
    // Live run: an actor silent for 30 s is stale. Finished run: ages are relative to its end.
    const age = (finished ? runEnd : now) - lastHeardOf(a);
    let cls = status === "failed" ? "bad" : (status === "restarting" ? "warn" : "ok");
    if (!finished && age > 30 && status !== "stopped") { status += " (stale)"; cls = "bad"; }
    const beat = finished ? `${ageText(age)} before the last record` : ageText(age);
    return `<tr data-actor="${a.source}"><td>${a.source}</td><td class="${cls}">${status}</td>` +
      `<td>${restarts ?? 0}</td><td>${beat}</td><td>${a.last_step}</td><td>${a.records}</td></tr>`;
  });
  document.querySelector("#actors-table tbody").innerHTML = rows.join("");

  const tables = new Map();
  for (const [name, bySource] of state.data) {
    const m = name.match(/^replay\/table\/([^/]+)\/(.+)$/);
    if (!m || !REPLAY_FIELDS.includes(m[2])) continue;
    if (!tables.has(m[1])) tables.set(m[1], {});
    for (const source of bySource.keys()) tables.get(m[1])[m[2]] = latestOf(name, source);
  }
  const fmt = (v) => (v === undefined ? "–" : Number(v).toLocaleString(undefined, { maximumFractionDigits: 2 }));
  document.querySelector("#replay-table tbody").innerHTML = [...tables.entries()].sort().map(([t, f]) =>
    `<tr><td>${t}</td>${REPLAY_FIELDS.map((k) => `<td>${fmt(f[k])}</td>`).join("")}</tr>`).join("");
}

function render() {
  for (const def of CHARTS) drawChart(def);
  drawHeatmaps();
  drawFleet();
  const info = state.info;
  document.getElementById("run-title").textContent = info && info.title ? `— ${info.title}` : "";
  const status = document.getElementById("status");
  const live = document.getElementById("live").checked;
  const { now, runEnd, finished } = runTimes();
  const mode = finished ? `finished (last record ${ageText(now - runEnd)})`
    : (live ? "live" : "paused");
  status.textContent = `${info.records} records, ${info.series} series, ${info.actors} actors` +
    ` · ${mode}` + (state.lastError ? ` · ${state.lastError}` : "");
  status.className = live && !finished && !state.lastError ? "status live" : "status";
  window.orreryDashboard.ready = true;
}

function redrawAll() {
  for (const entry of state.charts.values()) entry.plot.destroy();
  state.charts.clear();
  render();
}

async function loop() {
  try {
    await refresh();
    state.lastError = "";
  } catch (e) {
    state.lastError = `refresh failed: ${e.message}`;
    window.orreryDashboard.errors.push(String(e));
    document.getElementById("status").textContent = state.lastError;
  }
  if (document.getElementById("live").checked) setTimeout(loop, REFRESH_MS);
}

document.getElementById("x-axis").addEventListener("change", redrawAll);
document.getElementById("routing-step").addEventListener("input", drawHeatmaps);
document.getElementById("routing-source").addEventListener("change", drawHeatmaps);
document.getElementById("live").addEventListener("change", (e) => { if (e.target.checked) loop(); });
let resizeTimer = 0;
window.addEventListener("resize", () => { clearTimeout(resizeTimer); resizeTimer = setTimeout(redrawAll, 200); });
loop();
