// The live dashboard: polls /dashboard/points and draws line charts as SVG.
// No libraries: everything the page needs is in the shop binary.
"use strict";

const colors = {
  naive: "#d6453d", guard: "#2a7ab9", local: "#3f9b4f", refresh: "#8a5cc2", outside: "#444",
  rejects: "#2a7ab9", markers: "#e08a1e",
};
const paths = ["naive", "guard", "local", "refresh", "outside"];
const keep = 240; // points on screen: two minutes
const SVG = "http://www.w3.org/2000/svg";

// window.dashboard is read by the browser test: how many points arrived,
// the last one's seq, and what each chart drew last.
window.dashboard = { points: 0, seq: 0, drawn: {}, errors: [] };

const charts = {
  db: { series: paths, value: (p, s) => p.paths[s] && p.paths[s].db },
  p99: { series: paths, value: (p, s) => p.paths[s] && p.paths[s].p99 },
  redis: { series: paths, value: (p, s) => p.paths[s] && p.paths[s].redis },
  guard: { series: ["rejects", "markers"], value: (p, s) => p[s] },
};

let points = [];

function niceMax(v) {
  if (!(v > 0)) return 1;
  const e = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (v <= m * e) return m * e;
  return 10 * e;
}

function el(parent, name, attrs, text) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  parent.appendChild(e);
  return e;
}

function clock(ms) {
  const d = new Date(ms);
  return [d.getHours(), d.getMinutes(), d.getSeconds()].map((n) => String(n).padStart(2, "0")).join(":");
}

// spans groups consecutive points of one phase: a shaded band each.
function spans(shown) {
  const out = [];
  shown.forEach((p, i) => {
    const last = out[out.length - 1];
    if (p.phase && (!last || last.phase !== p.phase || last.to !== i - 1)) out.push({ phase: p.phase, from: i, to: i });
    else if (p.phase) last.to = i;
  });
  return out;
}

function draw(id) {
  const c = charts[id];
  const svg = document.getElementById(id);
  const W = 640, H = 260, L = 56, R = 10, T = 24, B = 24;
  svg.replaceChildren();
  const shown = points.slice(-keep);
  let max = 0;
  for (const p of shown) for (const s of c.series) max = Math.max(max, c.value(p, s) || 0);
  max = niceMax(max);
  // The points span the whole width, however few have come yet.
  const x = (i) => L + (W - L - R) * (shown.length <= 1 ? 1 : i / (shown.length - 1));
  const y = (v) => T + (H - T - B) * (1 - v / max);
  // Phases: a shaded band each, named by the scenario and path it ran;
  // the name turns upright where the band is too narrow for it.
  const bands = el(svg, "g", { class: "bands" });
  spans(shown).forEach((sp, k) => {
    const x0 = x(Math.max(sp.from - 0.5, 0)), x1 = x(Math.min(sp.to + 0.5, shown.length - 1));
    const g = el(bands, "g", { class: "band", "data-phase": sp.phase });
    el(g, "rect", { x: x0, y: T, width: Math.max(x1 - x0, 1), height: H - T - B,
      fill: k % 2 ? "rgba(0,0,0,0.03)" : "rgba(0,0,0,0.07)" });
    const label = el(g, "text", { class: "band-label", x: (x0 + x1) / 2, y: T + 12, "text-anchor": "middle" }, sp.phase);
    if (label.getComputedTextLength() + 6 > x1 - x0) {
      const cx = (x0 + x1) / 2 + 4;
      label.setAttribute("text-anchor", "end");
      label.setAttribute("x", cx);
      label.setAttribute("y", T + 4);
      label.setAttribute("transform", `rotate(-90 ${cx} ${T + 4})`);
    }
  });
  for (let i = 0; i <= 4; i++) {
    const v = max * i / 4;
    el(svg, "line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid" });
    el(svg, "text", { class: "ytick", x: L - 4, y: y(v) + 4, "text-anchor": "end" },
      v >= 1000 ? (v / 1000).toFixed(v % 1000 ? 1 : 0) + "k" : String(+v.toFixed(2)));
  }
  // The time axis: a tick where the clock passes a multiple of the step,
  // the step the smallest that keeps the labels 70 pixels apart.
  if (shown.length > 1) {
    const perPx = (shown[shown.length - 1].t - shown[0].t) / (W - L - R);
    const step = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600].find((s) => s * 1000 >= 70 * perPx) || 600;
    const axis = el(svg, "g", { class: "time-axis" });
    el(axis, "line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" });
    shown.forEach((p, i) => {
      if (i === 0 || Math.floor(p.t / 1000 / step) === Math.floor(shown[i - 1].t / 1000 / step)) return;
      el(axis, "line", { x1: x(i), x2: x(i), y1: H - B, y2: H - B + 4, class: "axis" });
      el(axis, "text", { class: "xtick", x: x(i), y: H - 6, "text-anchor": "middle" }, clock(p.t));
    });
  }
  const drawn = {};
  let k = 0;
  for (const s of c.series) {
    let d = "", n = 0, lastV = 0, top = 0, first = -1, end = -1, gap = true;
    shown.forEach((p, i) => {
      const v = c.value(p, s);
      if (v === undefined || v === null) { gap = true; return; }
      d += (gap ? "M" : "L") + x(i).toFixed(1) + " " + y(v).toFixed(1) + " ";
      gap = false;
      if (first < 0) first = x(i);
      end = x(i);
      n++; lastV = v; top = Math.max(top, v);
    });
    if (!n) continue; // a path with no points in view (outside, until it runs)
    el(svg, "path", { class: "series", "data-series": s, d: d, fill: "none", stroke: colors[s], "stroke-width": 2 });
    drawn[s] = { points: n, last: lastV, max: top, span: n > 1 ? end - first : 0 };
    el(svg, "rect", { x: L + 8 + k * 90, y: 6, width: 10, height: 10, fill: colors[s] });
    el(svg, "text", { class: "legend", x: L + 22 + k * 90, y: 15 }, s);
    k++;
  }
  window.dashboard.drawn[id] = drawn;
}

async function poll() {
  try {
    const r = await fetch("points?after=" + window.dashboard.seq, { cache: "no-store" });
    if (!r.ok) throw new Error("points: HTTP " + r.status);
    const fresh = await r.json();
    if (fresh.length) {
      points = points.concat(fresh).slice(-keep);
      window.dashboard.seq = fresh[fresh.length - 1].seq;
      window.dashboard.points += fresh.length;
      for (const id of Object.keys(charts)) draw(id);
      const p = fresh[fresh.length - 1];
      document.getElementById("status").textContent =
        (p.phase ? "now: " + p.phase + " · " : "idle · ") + window.dashboard.points + " points";
    }
  } catch (e) {
    document.getElementById("status").textContent = "cannot reach the shop: " + e.message;
  }
  setTimeout(poll, 1000);
}

poll();
