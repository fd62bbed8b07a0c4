// The live dashboard: polls /dashboard/points and draws line charts on
// canvases. No libraries: everything the page needs is in the shop binary.
"use strict";

const colors = { naive: "#d6453d", guard: "#2a7ab9", local: "#3f9b4f", refresh: "#8a5cc2", rejects: "#2a7ab9", markers: "#e08a1e" };
const keep = 240; // points on screen: two minutes

// window.dashboard is read by the browser test: how many points arrived,
// what each chart drew last, and where its labels went.
window.dashboard = { points: 0, drawn: {}, layout: {}, errors: [] };

const charts = {
  db: { series: ["naive", "guard"], value: (p, s) => p.paths[s] && p.paths[s].db },
  p99: { series: ["naive", "guard"], value: (p, s) => p.paths[s] && p.paths[s].p99 },
  redis: { series: ["naive", "guard"], value: (p, s) => p.paths[s] && p.paths[s].redis },
  guard: { series: ["rejects", "markers"], value: (p, s) => p[s] },
};

let points = [];
let last = 0;

function niceMax(v) {
  if (!(v > 0)) return 1;
  const e = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (v <= m * e) return m * e;
  return 10 * e;
}

function draw(id) {
  const c = charts[id];
  const canvas = document.getElementById(id);
  const ctx = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height, L = 56, R = 10, T = 22, B = 22;
  ctx.clearRect(0, 0, W, H);
  const shown = points.slice(-keep);
  let max = 0;
  for (const p of shown) for (const s of c.series) max = Math.max(max, c.value(p, s) || 0);
  max = niceMax(max);
  ctx.font = "11px system-ui, sans-serif";
  // The points span the whole width, however few have come yet.
  const x = (i) => L + (W - L - R) * (shown.length <= 1 ? 1 : i / (shown.length - 1));
  // Phases: a shaded band each, labelled where the label fits inside it
  // (the status line names the current one anyway).
  const spans = [];
  shown.forEach((p, i) => {
    const last = spans[spans.length - 1];
    if (p.phase && (!last || last.phase !== p.phase || last.to !== i - 1)) spans.push({ phase: p.phase, from: i, to: i });
    else if (p.phase) last.to = i;
  });
  const labels = [];
  spans.forEach((sp, k) => {
    const x0 = x(Math.max(sp.from - 0.5, 0)), x1 = x(Math.min(sp.to + 0.5, shown.length - 1));
    ctx.fillStyle = k % 2 ? "rgba(0,0,0,0.025)" : "rgba(0,0,0,0.06)";
    ctx.fillRect(x0, T, Math.max(x1 - x0, 1), H - T - B);
    const w = ctx.measureText(sp.phase).width;
    if (w + 6 <= x1 - x0) {
      const lx = (x0 + x1 - w) / 2;
      ctx.fillStyle = "#777";
      ctx.fillText(sp.phase, lx, H - 6);
      labels.push({ x: lx, w: w, text: sp.phase });
    }
  });
  ctx.strokeStyle = "#e5e5e5";
  ctx.fillStyle = "#666";
  for (let i = 0; i <= 4; i++) {
    const y = T + (H - T - B) * (1 - i / 4);
    ctx.beginPath(); ctx.moveTo(L, y); ctx.lineTo(W - R, y); ctx.stroke();
    const v = max * i / 4;
    ctx.fillText(v >= 1000 ? (v / 1000).toFixed(v % 1000 ? 1 : 0) + "k" : String(+v.toFixed(2)), 4, y + 4);
  }
  const drawn = {};
  window.dashboard.layout[id] = { labels: labels, width: W - L - R };
  c.series.forEach((s, k) => {
    ctx.strokeStyle = colors[s]; ctx.lineWidth = 2; ctx.beginPath();
    let n = 0, lastV = 0, top = 0, first = -1, end = -1;
    shown.forEach((p, i) => {
      const v = c.value(p, s);
      if (v === undefined || v === null) return;
      const y = T + (H - T - B) * (1 - v / max);
      n ? ctx.lineTo(x(i), y) : ctx.moveTo(x(i), y);
      if (first < 0) first = x(i);
      end = x(i);
      n++; lastV = v; top = Math.max(top, v);
    });
    ctx.stroke();
    drawn[s] = { points: n, last: lastV, max: top, span: n > 1 ? end - first : 0 };
    ctx.fillStyle = colors[s];
    ctx.fillRect(L + 8 + k * 90, 6, 10, 10);
    ctx.fillStyle = "#333";
    ctx.fillText(s, L + 22 + k * 90, 15);
  });
  window.dashboard.drawn[id] = drawn;
}

async function poll() {
  try {
    const r = await fetch("points?after=" + last, { cache: "no-store" });
    if (!r.ok) throw new Error("points: HTTP " + r.status);
    const fresh = await r.json();
    if (fresh.length) {
      points = points.concat(fresh).slice(-keep);
      last = fresh[fresh.length - 1].seq;
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
