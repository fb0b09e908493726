// The vramd dashboard: reads /api, draws with the DOM. No framework, no build step.
//
// Every value from the server goes into the page as text (textContent, createTextNode,
// SVG attributes): nothing is ever parsed as HTML.
"use strict";

const KEY_STORAGE = "vramd.adminKey";
const STATUS_EVERY_MS = 1500;
const EVENTS_POLL_MS = 2000;
const CHARTS_EVERY_MS = 5000;
const INCIDENTS_EVERY_MS = 10000;
const CHART_WINDOW_S = 15 * 60;
// The chart shows the shortest of these windows that holds every sample it got.
const CHART_SPANS = [[60, "−1 min"], [5 * 60, "−5 min"], [CHART_WINDOW_S, "−15 min"]];
const MAX_EVENTS = 50;
const PALETTE = [
  "#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#e15759",
  "#76b7b2", "#edc948", "#9c755f", "#ff9da7", "#86bcb6",
];
const FLAG_TEXT = {
  "creeping": "creeping",
  "fragmented": "fragmented",
  "over-cap": "over cap",
  "crash-looping": "crash-looping",
};

const ui = {
  key: sessionStorage.getItem(KEY_STORAGE),
  needsKey: false,
  status: null,
  colors: new Map(),
  rows: new Map(),
  charts: new Map(),
  events: [],
  lastEventId: 0,
  source: null,
  timers: [],
  busy: new Set(),
  retry: null,
};

// ------------------------------------------------------------------ DOM helpers

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const SVG_NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value !== null && value !== undefined) node.setAttribute(name, String(value));
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function setText(node, text) {
  const value = text === null || text === undefined ? "" : String(text);
  if (node.textContent !== value) node.textContent = value;
}

// ------------------------------------------------------------------- formatting

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];

function bytes(n) {
  if (n === null || n === undefined) return "—";
  const sign = n < 0 ? "−" : "";
  let value = Math.abs(n);
  let unit = 0;
  while (value >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  const digits = unit === 0 || value >= 100 ? 0 : value >= 10 ? 1 : 2;
  return `${sign}${value.toFixed(digits)} ${UNITS[unit]}`;
}

function duration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m${s % 60 ? `${s % 60}s` : ""}`;
  return `${Math.floor(m / 60)}h${m % 60 ? `${m % 60}m` : ""}`;
}

function clock(ts) {
  return new Date(ts * 1000).toLocaleTimeString([], { hour12: false });
}

function when(ts) {
  const date = new Date(ts * 1000);
  const today = new Date().toDateString() === date.toDateString();
  return today ? clock(ts) : date.toLocaleString([], { hour12: false });
}

function colorOf(name) {
  if (!ui.colors.has(name)) ui.colors.set(name, PALETTE[ui.colors.size % PALETTE.length]);
  return ui.colors.get(name);
}

// ------------------------------------------------------------------------- API

class KeyNeeded extends Error {}

async function api(path, options = {}) {
  const headers = new Headers(options.headers || {});
  if (ui.key) headers.set("Authorization", `Bearer ${ui.key}`);
  const response = await fetch(path, { ...options, headers, cache: "no-store" });
  if (response.status === 401) {
    askForKey(ui.key ? "That key was refused." : null);
    throw new KeyNeeded("admin key required");
  }
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    const message = body && body.error ? body.error.message : `HTTP ${response.status}`;
    throw new Error(message);
  }
  return body;
}

function setConnection(state, text) {
  const node = document.getElementById("conn");
  node.dataset.state = state;
  setText(node, text);
}

let noticeTimer = null;

function notice(text, kind = "info") {
  const node = document.getElementById("notice");
  node.hidden = false;
  node.dataset.kind = kind;
  setText(node, text);
  clearTimeout(noticeTimer);
  noticeTimer = setTimeout(() => { node.hidden = true; }, kind === "error" ? 12000 : 5000);
}

// ------------------------------------------------------------------ admin key

function askForKey(error) {
  ui.needsKey = true;
  stopTimers();
  document.getElementById("app").hidden = true;
  document.getElementById("keygate").hidden = false;
  const message = document.getElementById("key-error");
  message.hidden = !error;
  setText(message, error || "");
  setConnection("locked", "admin key needed");
  document.getElementById("key-input").focus();
}

function onKeySubmit(event) {
  event.preventDefault();
  const input = document.getElementById("key-input");
  const key = input.value.trim();
  if (!key) return;
  ui.key = key;
  sessionStorage.setItem(KEY_STORAGE, key);
  input.value = "";
  start();
}

function forgetKey() {
  sessionStorage.removeItem(KEY_STORAGE);
  ui.key = null;
  askForKey(null);
}

// ------------------------------------------------------------------ memory bar

// The devices a service's instance is on: several for a ``span: N`` service.
function devicesOf(s) {
  return s.devices && s.devices.length ? s.devices : s.device === null ? [] : [s.device];
}

// What the service holds on one device: its share there for a span, else its footprint.
function bytesOn(s, index) {
  if (devicesOf(s).length > 1) return (s.device_bytes || {})[String(index)] || 0;
  return s.footprint_bytes || 0;
}

function deviceSegments(device, services) {
  const mine = services
    .filter((s) => s.pid !== null && devicesOf(s).includes(device.index))
    .map((s) => ({ ...s, footprint_bytes: bytesOn(s, device.index) }));
  const charges = device.charges || {};
  const managed = mine.reduce((sum, s) => sum + (s.footprint_bytes || 0), 0);
  const total = device.total_bytes;
  const foreign = Math.max(0, device.foreign_bytes || 0);
  let rest = Math.max(0, total - managed - foreign);
  const segments = [];
  for (const s of mine) {
    if (s.footprint_bytes > 0) {
      segments.push({
        key: s.name, label: s.name, bytes: s.footprint_bytes, color: colorOf(s.name),
        kind: "service", note: "in use",
      });
    }
  }
  // Reserved: charged to a service (its expected peak) but not yet used by it.
  let reserved = 0;
  for (const [name, charge] of Object.entries(charges)) {
    const used = (mine.find((s) => s.name === name) || {}).footprint_bytes || 0;
    const extra = Math.min(Math.max(0, charge - used), rest - reserved);
    if (extra > 0) {
      segments.push({
        key: `${name}-reserved`, label: `${name} reserved`, bytes: extra,
        color: colorOf(name), kind: "reserved", note: "charged, not yet used",
      });
      reserved += extra;
    }
  }
  rest -= reserved;
  const budget = device.budget_bytes || 0;
  const freeIn = Math.min(Math.max(0, budget - managed - reserved), rest);
  rest -= freeIn;
  const headroom = Math.min(Math.max(0, device.headroom_bytes || 0), rest);
  rest -= headroom;
  const inner = managed + reserved + freeIn + headroom;
  segments.push({ key: "free", label: "free in budget", bytes: freeIn, kind: "free" });
  segments.push({ key: "headroom", label: "headroom", bytes: headroom, kind: "headroom" });
  const tail = [
    { key: "outside", label: "free outside budget", bytes: rest, kind: "outside", tail: true },
    { key: "foreign", label: "foreign", bytes: foreign, kind: "foreign", tail: true },
  ];
  return { segments: segments.concat(tail), inner, tailBytes: rest + foreign, total, budget };
}

// When the budget is a small part of the device (the host backend, or a budget far
// below the card's size), the part outside it is drawn compressed so that the
// services stay visible; the bar says so.
const TAIL_SHARE = 0.2;

function layout(plan) {
  const compressed = plan.tailBytes > plan.inner * 2 && plan.inner > 0;
  const widths = new Map();
  for (const seg of plan.segments) {
    let share;
    if (!compressed) share = seg.bytes / plan.total;
    else if (seg.tail) share = (seg.bytes / plan.tailBytes) * TAIL_SHARE;
    else share = (seg.bytes / plan.inner) * (1 - TAIL_SHARE);
    widths.set(seg.key, share * 100);
  }
  const budgetAt = compressed
    ? (Math.min(plan.budget, plan.inner) / plan.inner) * (1 - TAIL_SHARE) * 100
    : (plan.budget / plan.total) * 100;
  return { compressed, widths, budgetAt };
}

function renderDevices(status) {
  const host = document.getElementById("devices");
  const note = document.getElementById("backend-note");
  setText(note, status.backend ? `backend: ${status.backend}${status.degraded ? " (degraded)" : ""}` : "");
  const cards = status.devices.map((device) => deviceCard(device, status.services));
  host.replaceChildren(...(cards.length ? cards : [el("p", { class: "card muted", text: "No device reading yet." })]));
}

function deviceCard(device, services) {
  const plan = deviceSegments(device, services);
  const { compressed, widths, budgetAt } = layout(plan);
  const bar = el("div", { class: "bar" + (compressed ? " compressed" : ""), role: "img" });
  const described = [];
  for (const seg of plan.segments) {
    const width = widths.get(seg.key);
    if (!(width > 0)) continue;
    const part = el("div", {
      class: `seg seg-${seg.kind}`,
      title: `${seg.label}: ${bytes(seg.bytes)}`,
      "data-segment": seg.key,
    });
    part.style.width = `${width}%`;
    if (seg.color) part.style.backgroundColor = seg.color;
    if (seg.kind === "service" && width > 4.5) part.append(el("span", { class: "seg-label", text: seg.label }));
    if (seg.key === "outside" && compressed) part.classList.add("break");
    bar.append(part);
    described.push(`${seg.label} ${bytes(seg.bytes)}`);
  }
  if (plan.budget > 0) {
    const line = el("div", { class: "budget-line", title: `budget ${bytes(plan.budget)}` });
    line.style.left = `${Math.min(100, budgetAt)}%`;
    line.append(el("span", { text: "budget" }));
    bar.append(line);
  }
  bar.setAttribute("aria-label", `Device ${device.index} memory: ${described.join(", ")}`);

  const legend = el("ul", { class: "legend" });
  for (const seg of plan.segments) {
    if (seg.bytes <= 0 && seg.kind !== "free") continue;
    const swatch = el("span", { class: `swatch seg-${seg.kind}`, "aria-hidden": "true" });
    if (seg.color) swatch.style.backgroundColor = seg.color;
    legend.append(el("li", {}, swatch, el("span", { text: seg.label }), " ", el("strong", { text: bytes(seg.bytes) })));
  }
  const available = device.available_bytes;
  const figures = el("dl", { class: "figures" },
    el("div", {}, el("dt", { text: "used" }), el("dd", { text: `${bytes(device.used_bytes)} of ${bytes(device.total_bytes)}` })),
    el("div", {}, el("dt", { text: "managed" }), el("dd", { text: bytes(device.managed_bytes) })),
    el("div", {}, el("dt", { text: "budget" }), el("dd", { text: bytes(device.budget_bytes) })),
    el("div", { class: available !== null && available < 0 ? "warn" : "" },
      el("dt", { text: "available" }), el("dd", { text: bytes(available) })),
  );
  return el("article", { class: "card device", "data-device": device.index },
    el("header", { class: "device-head" },
      el("h3", { text: `Device ${device.index}` }),
      el("span", { class: "muted", text: device.name || "" }),
      figures),
    bar,
    compressed ? el("p", { class: "muted small scale-note", text: "The part outside the budget is drawn compressed (not to scale)." }) : null,
    legend);
}

// ------------------------------------------------------------- services table

const ACTIONS = [
  { action: "load", label: "Load", disabledIn: ["ready", "starting"] },
  { action: "unload", label: "Unload", disabledIn: ["stopped", "stopping", "failed"] },
  { action: "restart", label: "Restart", disabledIn: ["starting", "stopping"] },
];

function serviceRow(name) {
  const cells = {};
  const cell = (field, cls) => (cells[field] = el("td", { class: cls || null, "data-field": field }));
  const swatch = el("span", { class: "dot", "aria-hidden": "true" });
  swatch.style.backgroundColor = colorOf(name);
  const nameCell = el("th", { scope: "row", class: "svc-name" },
    swatch, el("span", { class: "name", text: name }), el("span", { class: "models muted small" }));
  const actions = el("td", { class: "actions" });
  const buttons = {};
  for (const spec of ACTIONS) {
    buttons[spec.action] = el("button", {
      type: "button", class: "button small", "data-action": spec.action,
      "aria-label": `${spec.label} ${name}`, onclick: () => runAction(name, spec.action),
    }, spec.label);
    actions.append(buttons[spec.action]);
  }
  const row = el("tr", { "data-service": name }, nameCell,
    cell("state"), cell("used", "num"), cell("learned", "num"), cell("cap", "num"),
    cell("in_flight", "num"), cell("queued", "num"), cell("flags"), actions);
  return { row, cells, buttons, nameCell };
}

function renderServices(services) {
  const body = document.querySelector("#services tbody");
  const names = services.map((s) => s.name);
  if (names.join("\n") !== [...ui.rows.keys()].join("\n")) {
    ui.rows.clear();
    for (const name of names) ui.rows.set(name, serviceRow(name));
    body.replaceChildren(...[...ui.rows.values()].map((r) => r.row));
  }
  for (const s of services) updateRow(ui.rows.get(s.name), s);
}

function updateRow(r, s) {
  setText(r.nameCell.querySelector(".models"), `${s.kind} · ${s.models.join(", ")}`);
  const badge = el("span", { class: `badge state-${s.state}`, text: s.state });
  const stateParts = [badge];
  if (s.waiting_for) {
    // What the load waits for (docs/operations.md, "How vramd decides", step 4): who holds
    // the memory and until when.
    const text = s.waiting_for.replace(`${s.name} `, "");
    stateParts.push(el("span", { class: "sub waiting", title: s.waiting_for, text }));
  } else if (s.waiting_for_memory) {
    stateParts.push(el("span", { class: "sub", text: "waiting for memory" }));
  }
  if (s.protected_for_s !== null && s.protected_for_s !== undefined && s.protected_for_s > 0) {
    stateParts.push(el("span", { class: "sub muted", text: `protected ${duration(s.protected_for_s)} more` }));
  }
  if (s.last_error && s.state !== "ready") {
    stateParts.push(el("span", { class: "sub error-text", title: s.last_error, text: s.last_error }));
  }
  replaceIfChanged(r.cells.state, stateParts);

  const used = [el("span", { text: s.pid !== null ? bytes(s.footprint_bytes) : "—" })];
  if (s.cap_bytes && s.pid !== null) {
    const ratio = Math.min(1, s.footprint_bytes / s.cap_bytes);
    const fill = el("span", { class: "meter-fill" + (ratio > 0.9 ? " hot" : "") });
    fill.style.width = `${(ratio * 100).toFixed(1)}%`;
    used.push(el("span", { class: "meter", title: `${Math.round(ratio * 100)}% of cap`, "aria-hidden": "true" }, fill));
  }
  const spans = devicesOf(s);
  if (s.pid !== null && spans.length > 1) {
    const parts = spans.map((d) => `${bytes(bytesOn(s, d))} on ${d}`).join(" · ");
    used.push(el("span", { class: "sub muted", "data-span": spans.join(","), text: parts }));
  }
  r.cells.used.replaceChildren(...used);
  setText(r.cells.learned, bytes(s.learned_peak_bytes));
  setText(r.cells.cap, s.cap_bytes ? bytes(s.cap_bytes) : "none");
  setText(r.cells.in_flight, s.in_flight);
  setText(r.cells.queued, s.queued);
  const flags = s.flags.map((f) => el("span", { class: "badge flag", text: FLAG_TEXT[f] || f }));
  replaceIfChanged(r.cells.flags, flags.length ? flags : [el("span", { class: "muted", text: "—" })]);
  for (const spec of ACTIONS) {
    const button = r.buttons[spec.action];
    button.disabled = ui.busy.has(s.name) || spec.disabledIn.includes(s.state);
  }
}

function replaceIfChanged(node, children) {
  const probe = el("div", {}, ...children);
  if (probe.innerHTML === node.innerHTML) return; // compares markup we built ourselves
  node.replaceChildren(...probe.childNodes);
}

async function runAction(name, action) {
  if (ui.busy.has(name)) return;
  ui.busy.add(name);
  const row = ui.rows.get(name);
  if (row) {
    row.row.setAttribute("aria-busy", "true");
    for (const button of Object.values(row.buttons)) button.disabled = true;
  }
  notice(`${action} ${name}…`);
  try {
    const view = await api(`/api/services/${encodeURIComponent(name)}/${action}`, { method: "POST" });
    notice(`${action} ${name}: now ${view.state}`);
  } catch (error) {
    if (!(error instanceof KeyNeeded)) notice(`${action} ${name} failed: ${error.message}`, "error");
  } finally {
    ui.busy.delete(name);
    if (row) row.row.removeAttribute("aria-busy");
    refreshSoon();
  }
}

// --------------------------------------------------------------------- charts

function chartCard(name) {
  const figure = el("figure", { class: "card chart", "data-service": name });
  const head = el("figcaption", {},
    el("span", { class: "dot", "aria-hidden": "true" }),
    el("span", { class: "name", text: name }),
    el("span", { class: "muted small now" }));
  head.firstChild.style.backgroundColor = colorOf(name);
  const plot = svg("svg", { viewBox: "0 0 320 120", role: "img" });
  figure.append(head, plot);
  return { figure, plot, head };
}

function renderChartCards(services) {
  const host = document.getElementById("charts");
  const names = services.map((s) => s.name);
  if (names.join("\n") === [...ui.charts.keys()].join("\n")) return;
  ui.charts.clear();
  for (const name of names) ui.charts.set(name, chartCard(name));
  host.replaceChildren(...[...ui.charts.values()].map((c) => c.figure));
}

async function refreshCharts() {
  const since = Date.now() / 1000 - CHART_WINDOW_S;
  await Promise.all([...ui.charts.keys()].map(async (name) => {
    try {
      const data = await api(`/api/services/${encodeURIComponent(name)}/memory?since=${since.toFixed(0)}`);
      drawChart(ui.charts.get(name), data);
    } catch (error) {
      if (error instanceof KeyNeeded) throw error;
    }
  })).catch(() => {});
}

function drawChart(chart, data) {
  if (!chart) return;
  // Drawn at the element's own width, so text and strokes are never stretched.
  const W = Math.max(200, Math.round(chart.plot.getBoundingClientRect().width) || 320);
  const H = 120, PAD_T = 14, PAD_B = 16, PAD_L = 4, PAD_R = 4;
  chart.plot.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const samples = data.samples || [];
  const end = Math.max(Date.now() / 1000, samples.length ? samples[samples.length - 1].ts : 0);
  const oldest = samples.length ? samples[0].ts : end;
  const [span, spanLabel] = CHART_SPANS.find(([s]) => end - oldest <= s) || CHART_SPANS[CHART_SPANS.length - 1];
  const start = end - span;
  const peak = Math.max(0, ...samples.map((p) => p.device_bytes || 0));
  const top = Math.max(peak, data.cap_bytes || 0, data.learned_peak_bytes || 0, data.estimate_bytes || 0, 1) * 1.08;
  const x = (ts) => PAD_L + ((ts - start) / span) * (W - PAD_L - PAD_R);
  const y = (v) => H - PAD_B - (v / top) * (H - PAD_T - PAD_B);
  const color = colorOf(data.service);

  const parts = [svg("title", {}, `${data.service} memory over the last 15 minutes`)];
  parts.push(svg("line", { x1: PAD_L, x2: W - PAD_R, y1: y(0), y2: y(0), class: "axis" }));
  // Cap labelled on the right, the other guide on the left: close values stay legible.
  const guide = (value, cls, label, right) => {
    if (!value) return;
    // A label that would sit on the cap line goes under its own line instead.
    const crowded = !right && data.cap_bytes && Math.abs(y(value) - y(data.cap_bytes)) < 12;
    parts.push(svg("line", { x1: PAD_L, x2: W - PAD_R, y1: y(value), y2: y(value), class: cls }));
    parts.push(svg("text", {
      x: right ? W - PAD_R - 2 : PAD_L + 2, y: crowded ? y(value) + 11 : y(value) - 3,
      class: `guide-label ${cls}`, "text-anchor": right ? "end" : "start",
    }, `${label} ${bytes(value)}`));
  };
  guide(data.cap_bytes, "cap", "cap", true);
  if (data.learned_peak_bytes) guide(data.learned_peak_bytes, "learned", "learned peak", false);
  else guide(data.estimate_bytes, "learned", "estimate", false);

  // One path per instance; a gap of more than 10 s (a stop, a restart) breaks the line.
  let d = "";
  let area = "";
  let previous = null;
  let runStart = null;
  const closeRun = (last) => {
    if (runStart !== null) area += `L${x(last.ts).toFixed(1)},${y(0).toFixed(1)}L${x(runStart.ts).toFixed(1)},${y(0).toFixed(1)}Z`;
  };
  for (const p of samples) {
    if (p.ts < start || p.device_bytes === null) continue;
    const pt = `${x(p.ts).toFixed(1)},${y(p.device_bytes).toFixed(1)}`;
    const broken = !previous || p.instance_id !== previous.instance_id || p.ts - previous.ts > 10;
    if (broken) {
      if (previous) closeRun(previous);
      d += `M${pt}`;
      area += `M${pt}`;
      runStart = p;
    } else {
      d += `L${pt}`;
      area += `L${pt}`;
    }
    previous = p;
  }
  if (previous) closeRun(previous);
  if (area) {
    const fill = svg("path", { d: area, class: "area", fill: color });
    parts.push(fill);
  }
  if (d) parts.push(svg("path", { d, class: "line", stroke: color }));
  else parts.push(svg("text", { x: W / 2, y: H * 0.7, class: "empty", "text-anchor": "middle" }, "no samples in the last 15 minutes"));
  parts.push(svg("text", { x: PAD_L, y: H - 3, class: "tick" }, spanLabel));
  parts.push(svg("text", { x: W - PAD_R, y: H - 3, class: "tick", "text-anchor": "end" }, "now"));
  chart.plot.replaceChildren(...parts);

  const view = ui.status ? ui.status.services.find((s) => s.name === data.service) : null;
  const loaded = view && view.pid !== null;
  const summary = (loaded ? `${bytes(data.footprint_bytes)} now` : "not loaded") +
    (samples.length ? ` · max ${bytes(peak)}` : "");
  setText(chart.head.querySelector(".now"), summary);
  chart.plot.setAttribute("aria-label", `${data.service} memory, last 15 minutes: ${summary}` +
    (data.cap_bytes ? `, cap ${bytes(data.cap_bytes)}` : ""));
}

// --------------------------------------------------------------------- events

function addEvents(events) {
  let added = false;
  for (const event of events) {
    if (event.id !== null && event.id <= ui.lastEventId) continue;
    if (event.id !== null) ui.lastEventId = event.id;
    ui.events.unshift(event);
    added = true;
  }
  if (!added) return;
  ui.events.length = Math.min(ui.events.length, MAX_EVENTS);
  renderEvents();
}

function renderEvents() {
  const list = document.getElementById("events");
  const items = ui.events.map((event) => {
    const service = event.service
      ? el("span", { class: "ev-service" }, el("span", { class: "dot", "aria-hidden": "true" }), event.service)
      : null;
    if (service) service.firstChild.style.backgroundColor = colorOf(event.service);
    return el("li", { class: `ev kind-${String(event.kind).replace(/[^a-z-]/gi, "")}` },
      el("div", { class: "ev-head" },
        el("time", { datetime: new Date(event.ts * 1000).toISOString(), text: clock(event.ts) }),
        el("span", { class: "ev-kind", text: event.kind }),
        service),
      el("p", { class: "ev-message", text: event.message }));
  });
  list.replaceChildren(...(items.length ? items : [el("li", { class: "muted empty-row", text: "No events yet." })]));
}

async function loadRecentEvents() {
  // Page forward through the last hour, keeping the newest MAX_EVENTS.
  let params = `since_ts=${(Date.now() / 1000 - 3600).toFixed(0)}`;
  for (let page = 0; page < 20; page += 1) {
    const data = await api(`/api/events?${params}&limit=500`);
    addEvents(data.events);
    if (data.events.length < 500) break;
    params = `since=${ui.lastEventId}`;
  }
  renderEvents();
}

async function pollEvents() {
  const data = await api(`/api/events?since=${ui.lastEventId}&limit=500`);
  addEvents(data.events);
  if (data.events.length) refreshSoon();
}

function openStream() {
  // EventSource cannot send an Authorization header: with a key, poll instead.
  if (ui.key || typeof EventSource === "undefined") {
    startPollingEvents();
    return;
  }
  const source = new EventSource("/api/events/stream");
  ui.source = source;
  source.onopen = () => {
    setConnection("live", "live");
    pollEvents().catch(() => {}); // anything recorded between the first page and now
  };
  source.onmessage = (message) => {
    try {
      addEvents([JSON.parse(message.data)]);
      refreshSoon();
    } catch (_) { /* a malformed frame: skip it */ }
  };
  source.onerror = () => {
    if (source.readyState === EventSource.CLOSED) {
      ui.source = null;
      startPollingEvents();
    } else {
      setConnection("offline", "reconnecting…");
    }
  };
}

function startPollingEvents() {
  setConnection("polling", "polling");
  every(EVENTS_POLL_MS, () => pollEvents());
}

// ------------------------------------------------------------------ incidents

async function refreshIncidents() {
  const data = await api("/api/incidents?limit=20");
  const host = document.getElementById("incidents");
  if (!data.incidents.length) {
    host.replaceChildren(el("p", { class: "muted empty-row", text: "No incidents recorded." }));
    return;
  }
  const rows = data.incidents.map((i) => el("tr", {},
    el("td", {}, el("time", { datetime: new Date(i.ts * 1000).toISOString(), text: when(i.ts) })),
    el("td", { text: i.service || "—" }),
    el("td", { text: i.kind }),
    el("td", {}, el("span", { class: `badge verdict`, text: i.verdict || "pending" })),
    el("td", { class: "summary", text: i.summary })));
  host.replaceChildren(el("table", { class: "incidents" },
    el("caption", { class: "visually-hidden", text: "Out-of-memory incidents, newest first" }),
    el("thead", {}, el("tr", {},
      ...["When", "Service", "Kind", "Verdict", "Summary"].map((h) => el("th", { scope: "col", text: h })))),
    el("tbody", {}, ...rows)));
}

// ------------------------------------------------------------------ usage

async function refreshUsage() {
  const data = await api("/api/usage?since=24h");
  const host = document.getElementById("usage");
  if (!data.usage.length) {
    host.replaceChildren(el("p", { class: "muted empty-row", text: "No requests in the last 24 hours." }));
    return;
  }
  const errors = (u) => Object.entries(u.errors_by_code).map(([code, n]) => `${n} ${code}`).join(", ");
  const rows = data.usage.map((u) => el("tr", {},
    el("td", { text: u.client }),
    el("td", { text: u.service }),
    el("td", { class: "num", text: String(u.requests) }),
    el("td", { class: "num", title: errors(u), text: String(u.errors) }),
    el("td", { class: "num", text: `${u.tokens_in} / ${u.tokens_out}` }),
    el("td", { class: "num", text: duration(u.runtime_s) })));
  host.replaceChildren(el("table", { class: "usage" },
    el("caption", { class: "visually-hidden", text: "Requests by client and service" }),
    el("thead", {}, el("tr", {},
      ...["Client", "Service", "Requests", "Errors", "Tokens in / out", "Runtime"].map((h) =>
        el("th", { scope: "col", text: h })))),
    el("tbody", {}, ...rows)));
}

// ------------------------------------------------------------------ the loop

let refreshing = false;
let refreshTimer = null;

async function refreshStatus() {
  if (refreshing) return;
  refreshing = true;
  try {
    const status = await api("/api/status");
    ui.status = status;
    setText(document.getElementById("meta"), `v${status.version}`);
    renderDevices(status);
    renderServices(status.services);
    renderChartCards(status.services);
    if (ui.source === null && document.getElementById("conn").dataset.state === "offline") {
      setConnection("polling", "polling");
    }
  } catch (error) {
    if (!(error instanceof KeyNeeded)) setConnection("offline", "offline");
    throw error;
  } finally {
    refreshing = false;
  }
}

function refreshSoon() {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(() => refreshStatus().catch(() => {}), 150);
}

function every(ms, task) {
  const run = () => Promise.resolve().then(task).catch(() => {});
  ui.timers.push(setInterval(run, ms));
}

function stopTimers() {
  for (const id of ui.timers) clearInterval(id);
  ui.timers = [];
  if (ui.source) {
    ui.source.close();
    ui.source = null;
  }
}

async function start() {
  stopTimers();
  try {
    await refreshStatus();
  } catch (error) {
    if (error instanceof KeyNeeded) return;
    setConnection("offline", "offline");
    clearTimeout(ui.retry);
    ui.retry = setTimeout(start, 2000);
    return;
  }
  ui.needsKey = false;
  document.getElementById("keygate").hidden = true;
  document.getElementById("app").hidden = false;
  document.getElementById("forget-key").hidden = !ui.key;
  every(STATUS_EVERY_MS, refreshStatus);
  every(CHARTS_EVERY_MS, refreshCharts);
  every(INCIDENTS_EVERY_MS, refreshIncidents);
  every(INCIDENTS_EVERY_MS, refreshUsage);
  refreshCharts();
  refreshIncidents().catch(() => {});
  refreshUsage().catch(() => {});
  try {
    await loadRecentEvents();
  } catch (error) {
    if (error instanceof KeyNeeded) return;
  }
  openStream();
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("key-form").addEventListener("submit", onKeySubmit);
  document.getElementById("forget-key").addEventListener("click", forgetKey);
  start();
});
