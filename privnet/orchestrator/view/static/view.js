// privnet view: one page of a run, fed by the orchestrator's event stream (read-only).
"use strict";

const PHASES = ["registering", "keying", "running", "held", "finished", "excluded", "failed", "left"];
const COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
  "#7f7f7f", "#bcbd22", "#17becf"];
const BYTES = [["model", "#1f77b4"], ["telemetry", "#2ca02c"], ["control", "#ff7f0e"]];

const $ = (id) => document.getElementById(id);
const svgNS = "http://www.w3.org/2000/svg";
const store = { meta: null, nodes: [], edges: [], series: {}, agents: [], live: {}, selected: null,
  neighbours: [] };
const charts = {};

function el(tag, attrs, parent, ns) {
  const node = ns ? document.createElementNS(svgNS, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}

function fmt(x, digits) {
  if (x === null || x === undefined) return "–";
  if (x === "inf") return "∞";
  return Number(x).toLocaleString("en", { maximumFractionDigits: digits ?? 1 });
}

function phaseColour(phase) {
  return getComputedStyle(document.documentElement).getPropertyValue("--" + phase).trim();
}

// ---- the stream ---------------------------------------------------------------------

function connect() {
  const source = new EventSource("events");
  source.addEventListener("snapshot", (e) => { const data = JSON.parse(e.data); init(data); apply(data); });
  source.addEventListener("delta", (e) => apply(JSON.parse(e.data)));
  source.addEventListener("end", (e) => {
    source.close();
    $("link").textContent = "the run is over: this page keeps its last state";
  });
  source.onerror = () => { $("link").textContent = "reconnecting…"; };
  source.onopen = () => { $("link").textContent = "connected"; };
}

function init(data) {
  store.meta = data.meta;
  store.nodes = data.nodes;
  store.edges = data.edges;
  store.series = {};
  const m = data.meta;
  $("run").textContent = `${m.run} · ${m.agents} agents · ${m.strategy} · ${m.scheme} · ${m.topology}`;
  $("link").textContent = m.live ? "live" : "a finished run's files";
  $("metric-title").textContent = m.metric === "msd" ? "MSD (dB)" : `${m.metric.replaceAll("_", " ")} (%)`;
  $("net-note").textContent = `${m.agents} agents, ${data.edges.length} links; width: model bytes per round`;
  drawTopology();
  legend();
  makeCharts();
}

function apply(data) {
  store.live = data.live;
  store.agents = data.agents;
  for (const [name, part] of Object.entries(data.series || {})) {
    const old = store.series[name];
    if (part.reset || !old) { store.series[name] = part; continue; }
    for (const [k, v] of Object.entries(part)) if (k !== "reset") old[k] = old[k].concat(v);
  }
  header();
  paintTopology(data.edge_bytes);
  agentsTable();
  timeline(data.timeline || []);
  updateCharts();
  privacy(data.epsilon, data.audit);
  sessions(data.results || []);
}

// ---- header -------------------------------------------------------------------------

function header() {
  const l = store.live;
  document.body.dataset.stage = l.stage;
  $("stage").textContent = l.stage;
  $("session").textContent = l.label || "";
  $("progress").textContent = l.rounds ? `round ${l.round} / ${l.rounds}` : "";
  $("rate").textContent = l.rate !== undefined && l.rate !== null ? `${fmt(l.rate)} rounds/s` : "";
  $("members").textContent = l.members !== undefined ? `view ${l.view ?? "–"}: ${l.members} members` : "";
  $("elapsed").textContent = l.elapsed !== undefined ? `${fmt(l.elapsed)} s` : "";
  if (l.failure) $("link").textContent = "failed: " + l.failure;
}

// ---- the network --------------------------------------------------------------------

function drawTopology() {
  const svg = $("topology");
  svg.textContent = "";
  const pad = 0.04;
  svg.setAttribute("viewBox", `${-pad} ${-pad} ${1 + 2 * pad} ${1 + 2 * pad}`);
  const p = store.nodes.length;
  const r = Math.max(0.008, Math.min(0.03, 0.16 / Math.sqrt(p)));
  const y = (v) => 1 - v;  // positions are in the unit square, y up
  const edges = el("g", { id: "edges" }, svg, true);
  store.edges.forEach(([u, v], n) => {
    const [x1, y1] = store.nodes[u], [x2, y2] = store.nodes[v];
    el("line", { class: "edge", x1, y1: y(y1), x2, y2: y(y2), "data-edge": n, "data-u": u, "data-v": v },
      edges, true);
  });
  const nodes = el("g", { id: "nodes" }, svg, true);
  store.nodes.forEach(([x, yy], a) => {
    const c = el("circle", { class: "agent", cx: x, cy: y(yy), r, "data-agent": a, "data-phase": "registering",
      "stroke-width": r / 4 }, nodes, true);
    el("title", {}, c, true);
    c.addEventListener("click", () => select(a));
    const t = el("text", { class: "id", x, y: y(yy) }, nodes, true);
    t.style.fontSize = `${r * 1.05}px`;
    t.textContent = a;
  });
  store.neighbours = store.nodes.map(() => []);
  store.edges.forEach(([u, v]) => { store.neighbours[u].push(v); store.neighbours[v].push(u); });
}

function paintTopology(edgeBytes) {
  const svg = $("topology");
  const most = Math.max(1, ...(edgeBytes || [1]));
  const scale = Math.max(0.002, Math.min(0.012, 0.06 / Math.sqrt(store.nodes.length)));
  svg.querySelectorAll("line.edge").forEach((line) => {
    const b = edgeBytes ? edgeBytes[+line.dataset.edge] : 0;
    line.classList.toggle("idle", !b);
    line.setAttribute("stroke-width", b ? scale * (0.35 + 0.65 * b / most) : scale * 0.35);
    line.dataset.bytes = b;
  });
  svg.querySelectorAll("circle.agent").forEach((c) => {
    const a = +c.dataset.agent, row = store.agents[a];
    if (!row) return;
    c.dataset.phase = row.phase;
    c.setAttribute("fill", phaseColour(row.phase));
    c.firstChild.textContent = `agent ${a}: ${row.phase}, round ${row.round}` +
      (row.view !== null ? `, view ${row.view}` : "") + (row.why ? ` (${row.why})` : "");
  });
}

function legend() {
  const box = $("legend");
  box.textContent = "";
  for (const phase of PHASES) {
    const span = el("span", {}, box);
    el("i", { style: `background:${phaseColour(phase)}` }, span);
    span.appendChild(document.createTextNode(phase));
  }
}

function select(agent) {
  store.selected = agent;
  const svg = $("topology");
  const near = new Set([agent, ...store.neighbours[agent]]);
  svg.classList.add("focus");
  svg.querySelectorAll("circle.agent").forEach((c) => {
    const a = +c.dataset.agent;
    c.classList.toggle("dim", !near.has(a));
    c.classList.toggle("selected", a === agent);
  });
  svg.querySelectorAll("text.id").forEach((t) => t.classList.toggle("dim", !near.has(+t.textContent)));
  svg.querySelectorAll("line.edge").forEach((l) => {
    l.classList.toggle("dim", +l.dataset.u !== agent && +l.dataset.v !== agent);
  });
  agentsTable();
  loadLog();
}

async function loadLog() {
  const a = store.selected;
  if (a === null) return;
  $("log-title").innerHTML = "";
  $("log-title").textContent = `agent ${a}'s log (its last lines) · neighbours ${store.neighbours[a].join(", ")}`;
  const response = await fetch(`log/${a}`);
  const pre = $("log");
  const text = response.ok ? await response.text() : `(no log: ${response.status})`;
  pre.textContent = text.trim() ? text : `(agent ${a}'s log is empty: agents log what goes wrong)`;
  pre.scrollTop = pre.scrollHeight;
}

// ---- tables -------------------------------------------------------------------------

function agentsTable() {
  const body = $("agents").tBodies[0];
  const rows = store.agents;
  while (body.rows.length < rows.length) {
    const tr = body.insertRow();
    const a = body.rows.length - 1;
    tr.dataset.agent = a;
    for (let i = 0; i < 8; i++) tr.insertCell();
    tr.addEventListener("click", () => select(a));
  }
  rows.forEach((row, a) => {
    const tr = body.rows[a];
    const rejected = Object.values(row.rejected).reduce((s, n) => s + n, 0);
    const cells = [a, null, row.round, row.view ?? "–", fmt(row.rss_mb, 0), fmt(row.cpu_pct, 0),
      rejected, row.why || ""];
    cells.forEach((v, i) => { if (i !== 1) tr.cells[i].textContent = v; });
    tr.cells[1].innerHTML = "";
    el("i", { class: "dot", style: `background:${phaseColour(row.phase)}` }, tr.cells[1]);
    tr.cells[1].appendChild(document.createTextNode(row.phase));
    tr.cells[6].title = Object.entries(row.rejected).map(([k, n]) => `${k}: ${n}`).join("\n") ||
      "none rejected (agents report theirs when a session ends)";
    tr.dataset.phase = row.phase;
    tr.classList.toggle("selected", a === store.selected);
  });
}

function timeline(entries) {
  const list = $("timeline");
  for (const [t, label, kind, text] of entries) {
    const li = el("li", { class: kind });
    el("span", { class: "t" }, li).textContent = `${fmt(t)} s`;
    el("span", { class: "kind" }, li).textContent = kind;
    li.appendChild(document.createTextNode(`${label ? label + ": " : ""}${text}`));
    list.prepend(li);
  }
}

function sessions(results) {
  const table = $("sessions");
  table.textContent = "";
  const head = el("tr", {}, el("thead", {}, table));
  for (const h of ["session", "rd/s", "model", "keys", "telem.", "ctl", "rejected"]) {
    el("th", {}, head).textContent = h;
  }
  const body = el("tbody", {}, table);
  for (const r of results) {
    const tr = el("tr", {}, body);
    const b = r.bytes_per_round || {};
    const rejected = Object.entries(r.rejected || {}).map(([k, n]) => `${k} ${n}`).join(", ");
    for (const v of [r.label, fmt(r.rounds_per_s), fmt(b.model, 0), fmt(b.keys, 0), fmt(b.telemetry, 0),
      fmt(b.control, 0), rejected || "0"]) el("td", {}, tr).textContent = v;
  }
  if (!results.length) el("td", { colspan: 7 }, el("tr", {}, body)).textContent =
    "each session's bytes per round (the agents' own counts) appear when it ends";
}

// ---- privacy ------------------------------------------------------------------------

function privacy(epsilon, audit) {
  const m = store.meta, svg = $("epsilon");
  svg.textContent = "";
  // The session shown, or else the latest one the accountant is done with.
  const done = (m.sessions || []).filter((s) => epsilon && epsilon.sessions &&
    epsilon.sessions[s] && epsilon.sessions[s].agents);
  let label = store.live.label || (m.sessions || []).slice(-1)[0];
  if (epsilon && !(epsilon.sessions[label] || {}).agents && done.length) label = done[done.length - 1];
  const eps = epsilon && epsilon.sessions ? epsilon.sessions[label] : null;
  if (!epsilon) {
    $("eps-note").textContent = m.live ? "accounting is off (privnet run --account)" : "no accounting in this run";
  } else if (!eps || eps.pending) {
    $("eps-note").textContent = `ε of ${label}: the accountant's twin runs are under way`;
  } else if (eps.error) {
    $("eps-note").textContent = "accountant failed: " + eps.error;
  } else {
    const n = epsilon.neighbour;
    $("eps-note").textContent = `ε per agent at round ${eps.round} of ${label}` +
      (n !== null && n !== undefined ? `; D' changes agent ${n}'s data` : "") + `; whole wire ${fmt(eps.network, 2)}`;
    bars(svg, eps.agents, n);
  }
  const box = $("audit");
  box.textContent = "";
  if (!audit) {
    box.textContent = m.audit ? "" : "wire audit is off (privnet run --audit)";
    return;
  }
  if (audit.recorded !== undefined) el("div", {}, box).textContent = `wire recorded: ${fmt(audit.recorded, 0)} frames`;
  if (!audit.checked) {
    el("div", {}, box).textContent = "checked against the replay once the run is done";
    return;
  }
  const t = el("table", {}, box);
  const h = el("tr", {}, t);
  for (const x of ["audited", "models", "clear", "max residual"]) el("th", {}, h).textContent = x;
  for (const s of audit.checked) {
    const tr = el("tr", {}, t);
    for (const v of [s.label, `${s.models}/${s.expected}`, s.clear, s.residual === null ? "–" : s.residual.toExponential(1)]) {
      el("td", {}, tr).textContent = v;
    }
  }
}

function bars(svg, values, neighbour) {
  const box = svg.getBoundingClientRect();
  const w = Math.max(100, box.width), h = Math.max(40, box.height);
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  const finite = values.filter((v) => typeof v === "number");
  const top = Math.max(1e-12, ...finite);
  const bw = (w - 30) / values.length;
  values.forEach((v, a) => {
    const inf = v === "inf";
    const height = inf ? h - 14 : (h - 14) * v / top;
    const r = el("rect", { x: 30 + a * bw + 0.5, y: h - 12 - height, width: Math.max(1, bw - 1), height,
      class: a === neighbour ? "neighbour" : "" }, svg, true);
    el("title", {}, r, true).textContent = `agent ${a}: ε = ${fmt(v, 3)}`;
  });
  el("text", { x: 0, y: 9 }, svg, true).textContent = finite.length ? fmt(top, 2) : "∞";
  el("text", { x: 0, y: h - 2 }, svg, true).textContent = "0";
}

// ---- charts -------------------------------------------------------------------------

function chart(id, series, opts) {
  const box = $(id);
  const size = () => ({ width: box.clientWidth, height: Math.max(60, box.clientHeight - 28) });
  const plot = new uPlot({ ...size(), series: [{}, ...series], scales: { x: { time: false } },
    legend: { live: false }, cursor: { drag: { x: false, y: false } }, ...opts },
  [[], ...series.map(() => [])], box);
  new ResizeObserver(() => plot.setSize(size())).observe(box);
  return plot;
}

function makeCharts() {
  for (const plot of Object.values(charts)) plot.destroy();
  const m = store.meta;
  const curves = [];
  m.sessions.forEach((label, n) => {
    const stroke = COLOURS[n % COLOURS.length];
    // centroid and average: at the rounds the agents sent models (every K); agents: their
    // own score every round (risk in dB, or the test metric on their held-out rows)
    curves.push({ label: `${label} centroid (model rounds)`, stroke, width: 1.5, spanGaps: true });
    curves.push({ label: `${label} average (model rounds)`, stroke, width: 1, dash: [4, 3], spanGaps: true });
    curves.push({ label: `${label} agents' own (every round)`, stroke, width: 1, dash: [1, 2], spanGaps: true });
  });
  const unit = m.metric === "msd" ? "dB" : "%";
  charts.msd = chart("msd", curves, { axes: [{ label: "round" }, { label: unit, size: 44 }] });
  charts.rates = chart("rates", [{ label: "rounds/s", stroke: "#31a354", width: 1.5 }],
    { axes: [{ label: "s" }, { size: 44 }] });
  charts.bytes = chart("bytes", BYTES.map(([name, stroke]) => ({ label: name, stroke, width: 1.5 })),
    { scales: { x: { time: false }, y: { distr: 3 } }, axes: [{ label: "s" }, { size: 62 }] });
}

function updateCharts() {
  if (!charts.msd) return;
  const tables = [];
  let points = 0;
  for (const label of store.meta.sessions) {
    const s = store.series[`curve:${label}`];
    tables.push(s ? [s.round, s.centroid, s.average, s.agents] : [[], [], [], []]);
    if (s) points += s.centroid.filter((v) => v !== null).length;
  }
  charts.msd.setData(uPlot.join(tables));
  $("msd").dataset.points = points;
  const r = store.series.rates;
  if (r) charts.rates.setData([r.t, r.rate]);
  const b = store.series.bytes;
  if (b) charts.bytes.setData([b.t, ...BYTES.map(([name]) => b[name].map((v) => (v > 0 ? v : null)))]);
}

setInterval(() => { if (store.selected !== null && store.meta && store.meta.live) loadLog(); }, 3000);
connect();
