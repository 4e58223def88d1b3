// Elastane RM web UI: keeps the server-rendered pages live by polling the RM's REST API.
// Elements with data-src are refreshed from that path: tables by their column specs
// (data-columns), field tables cell by cell (data-key, data-fmt), charts by their spec
// (data-chart), notes hidden once their data-hide-when path has a value. The formatters and the
// chart geometry mirror rm/web/format.py and rm/web/svg_chart.py. Everything inserted is escaped
// (names and reasons are user input).
"use strict";
(function () {
  const NA = "N/A";
  const UNITS = ["B", "KB", "MB", "GB", "TB", "PB"];

  function esc(v) {
    return String(v).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
      .replace(/"/g, "&quot;").replace(/'/g, "&#x27;");
  }
  function num(v) {
    if (v === null || v === undefined || typeof v === "boolean" || v === "") return null;
    const f = Number(v);
    return Number.isFinite(f) ? f : null;
  }
  function group(n) { return String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ","); }
  function sig(v, d) {
    d = d || 3;
    if (v === 0) return "0";
    if (Math.abs(v) >= Math.pow(10, d)) return group(Math.round(v));
    if (Math.abs(v) < 1e-4) return v.toExponential(d - 1).replace(/e([+-])(\d)$/, "e$10$2");   // as Python: e-06
    const dec = Math.max(0, d - 1 - Math.floor(Math.log10(Math.abs(v))));
    let t = v.toFixed(dec);
    if (Math.abs(Number(t)) >= Math.pow(10, d)) return group(Math.round(Number(t)));   // 999.6 -> 1,000
    if (t.indexOf(".") >= 0) t = t.replace(/0+$/, "").replace(/\.$/, "");
    return t;
  }
  function pad(n) { return String(n).padStart(2, "0"); }
  function clock(d) { return pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds()); }
  function seconds(v) {
    let f = num(v);
    if (f === null) return NA;
    f = Math.max(0, f);
    if (f < 1) return sig(f * 1000) + " ms";
    if (f < 60) return sig(f) + " s";
    const s = Math.floor(f);
    if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
    if (s < 86400) return Math.floor(s / 3600) + " h " + Math.floor(s % 3600 / 60) + " min";
    return Math.floor(s / 86400) + " d " + Math.floor(s % 86400 / 3600) + " h";
  }
  function bytes(v) {
    let f = num(v);
    if (f === null) return NA;
    let u = 0;
    while (Math.abs(f) >= 1024 && u < UNITS.length - 1) { f /= 1024; u++; }
    return sig(f) + " " + UNITS[u];
  }
  function text(v) {
    if (v === null || v === undefined) return "";
    if (typeof v === "boolean") return v ? "yes" : "no";
    if (Array.isArray(v)) return v.map(text).join(", ");
    return String(v);
  }
  const FORMATS = {
    text: text,
    num: (v) => { const f = num(v); return f === null ? NA : sig(f); },
    int: (v) => { const f = num(v); return f === null ? NA : group(Math.round(f)); },
    bytes: bytes,
    mb: (v) => { const f = num(v); return f === null ? NA : bytes(f * 1024 * 1024); },
    rate: (v) => { const t = bytes(v); return t === NA ? t : t + "/s"; },
    pct: (v) => { const f = num(v); return f === null ? NA : sig(f) + "%"; },
    cores: (v) => { const f = num(v); return f === null ? NA : sig(f) + (f === 1 ? " core" : " cores"); },
    speed: (v) => { const f = num(v); return f === null ? NA : sig(f) + " it/s"; },
    seconds: seconds,
    measured_s: (v) => { const f = num(v); return !f ? NA : seconds(f); },
    duration_ms: (v) => { const f = num(v); return f === null ? NA : seconds(f / 1000); },
    time: (v) => {
      const f = num(v);
      if (!f || f <= 0) return NA;
      const d = new Date(f);
      return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " + clock(d);
    },
    age: (v) => {
      const f = num(v);
      if (f === null) return NA;
      if (f <= 0) return "never";
      const age = Math.max(0, Date.now() - f) / 1000;
      return (age < 60 ? age.toFixed(1) + " s" : seconds(age)) + " ago";
    },
    placement: (v) => {
      if (!Array.isArray(v) || v.length === 0) return "anywhere";
      return v.filter((p) => p && typeof p === "object").map((p) => {
        const roles = ["workers", "servers"].filter((k) => p[k]).map((k) => p[k] + " " + k[0]);
        return (p.node === undefined ? "?" : p.node) + ": " + (roles.join(" + ") || "0");
      }).join("; ");
    },
  };
  function fmt(name, v) { return (FORMATS[name] || text)(v); }
  window.elastaneFormat = fmt;     // for the tests that compare it with rm/web/format.py
  function getPath(obj, path) {
    for (const step of path) {
      if (obj === null || typeof obj !== "object" || Array.isArray(obj)) return null;
      obj = obj[step];
    }
    return obj === undefined ? null : obj;
  }
  function cell(f, v) {
    if (f === "state") { const t = esc(text(v)); return '<span class="' + t + '">' + t + "</span>"; }
    if (f === "app" || f === "node") {
      if (!v) return "";
      const page = f === "app" ? "/cluster/app/" : "/cluster/node/";
      return '<a href="' + esc(page + encodeURIComponent(String(v))) + '">' + esc(v) + "</a>";
    }
    return esc(fmt(f, v));
  }

  // ----- tables and fields -----
  function compare(a, b) {
    if (typeof a === "number" && typeof b === "number") return a - b;
    return String(a) < String(b) ? -1 : String(a) > String(b) ? 1 : 0;
  }
  function updateTable(el, body) {
    const cols = JSON.parse(el.dataset.columns);
    let rows = getPath(body, JSON.parse(el.dataset.path));
    rows = Array.isArray(rows) ? rows.slice() : [];
    const sortKey = el.dataset.sort;
    if (sortKey) {
      const path = sortKey.split(".");
      const present = rows.filter((r) => getPath(r, path) !== null);
      const missing = rows.filter((r) => getPath(r, path) === null);
      present.sort((a, b) => compare(getPath(a, path), getPath(b, path)));
      if (el.dataset.desc === "1") present.reverse();
      rows = present.concat(missing);
    }
    let html = rows.map((r) => "<tr>" + cols.map((c) => "<td>" + cell(c.f, getPath(r, c.k)) + "</td>").join("")
      + "</tr>").join("");
    if (!html) html = '<tr><td colspan="' + cols.length + '">' + esc(el.dataset.empty || "none") + "</td></tr>";
    const tbody = el.tBodies[0];
    if (tbody.innerHTML !== html) tbody.innerHTML = html;
  }
  function updateFields(el, body) {
    const record = getPath(body, JSON.parse(el.dataset.path));
    for (const td of el.querySelectorAll("td[data-key]")) {
      const html = cell(td.dataset.fmt, getPath(record, JSON.parse(td.dataset.key)));
      if (td.innerHTML !== html) td.innerHTML = html;
    }
  }

  // ----- charts (geometry as rm/web/svg_chart.py) -----
  const W = 640, H = 200, LEFT = 60, RIGHT = 15, TOP = 22, BOTTOM = 30;
  const COLORS = ["#2a6fd6", "#d6602a", "#2aa05a", "#8a2ad6"];
  const MARKER_COLORS = { shape: "#c0392b", directive: "#7f8c8d", pause: "#e67e22" };
  function xText(x, xFmt) { return xFmt === "clock" ? clock(new Date(x * 1000)) : seconds(x); }
  function markerOf(type, r, t0) {
    const x = (num(r.time) - t0) / 1000;
    if (type === "changes") {
      const a = r.after || {}, b = r.before;
      const label = b ? "shape: " + b.workers + " \u2192 " + a.workers + " workers, " + b.servers + " \u2192 "
        + a.servers + " servers" : "shape: " + a.workers + " workers, " + a.servers + " servers";
      return { x: x, label: label, kind: "shape" };
    }
    return { x: x, kind: r.runState === "pause" ? "pause" : "directive",
      label: "directive v" + r.version + ": " + r.workers + " workers, " + r.servers + " servers, " + r.runState
        + ". " + (r.reason || "") };
  }
  function chartSvg(spec, body) {
    const t0 = spec.t0 || 0;
    const series = spec.series.map((s) => {
      let recs = getPath(body, s.path);
      recs = Array.isArray(recs) ? recs : [];
      if (spec.perEpoch) {
        const seen = new Set();
        recs = recs.filter((r) => {
          if (r.epoch === null || r.epoch === undefined || seen.has(r.epoch)) return false;
          seen.add(r.epoch);
          return true;
        });
      }
      const pts = [];
      for (const r of recs) {
        const x = num(r[s.x]), y = num(r[s.y]);
        if (x !== null && y !== null) pts.push([(x - t0) / 1000, y]);
      }
      return { label: s.label, points: pts };
    }).filter((s) => s.points.length > 0);
    if (series.length === 0) return '<p class="nochart">' + esc(spec.title) + ": no data reported yet.</p>";
    const markers = [];
    for (const m of spec.markers || []) {
      const recs = getPath(body, m.path);
      for (const r of Array.isArray(recs) ? recs : []) if (num(r.time) !== null) markers.push(markerOf(m.type, r, t0));
    }
    const xs = [], ys = [];
    for (const s of series) for (const p of s.points) { xs.push(p[0]); ys.push(p[1]); }
    for (const m of markers) xs.push(m.x);
    let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(0, Math.min(...ys)), y1 = Math.max(...ys);
    if (x1 === x0) x1 = x0 + 1;
    if (y1 === y0) y1 = y0 + 1;
    const pw = W - LEFT - RIGHT, ph = H - TOP - BOTTOM;
    const sx = (x) => (LEFT + (x - x0) / (x1 - x0) * pw).toFixed(1);
    const sy = (y) => (TOP + ph - (y - y0) / (y1 - y0) * ph).toFixed(1);
    const t = esc(spec.title), yf = spec.yFmt || "num", xf = spec.xFmt || "s";
    const out = ['<svg class="' + esc(spec.cssClass || "chart") + '" xmlns="http://www.w3.org/2000/svg" width="' + W
      + '" height="' + H + '" viewBox="0 0 ' + W + " " + H + '" role="img" aria-label="' + t + '">',
      '<text x="' + LEFT + '" y="14" font-size="12" font-weight="bold">' + t + "</text>",
      '<line x1="' + LEFT + '" y1="' + (TOP + ph) + '" x2="' + (LEFT + pw) + '" y2="' + (TOP + ph) + '" stroke="#888"/>',
      '<line x1="' + LEFT + '" y1="' + TOP + '" x2="' + LEFT + '" y2="' + (TOP + ph) + '" stroke="#888"/>',
      '<text x="' + (LEFT - 4) + '" y="' + (TOP + 4) + '" font-size="10" text-anchor="end">' + esc(fmt(yf, y1)) + "</text>",
      '<text x="' + (LEFT - 4) + '" y="' + (TOP + ph) + '" font-size="10" text-anchor="end">' + esc(fmt(yf, y0)) + "</text>",
      '<text x="' + LEFT + '" y="' + (H - 8) + '" font-size="10">' + esc(xText(x0, xf)) + "</text>",
      '<text x="' + (LEFT + pw) + '" y="' + (H - 8) + '" font-size="10" text-anchor="end">' + esc(xText(x1, xf)) + "</text>"];
    for (const m of markers) {
      out.push('<line class="marker ' + esc(m.kind) + '" x1="' + sx(m.x) + '" y1="' + TOP + '" x2="' + sx(m.x) + '" y2="'
        + (TOP + ph) + '" stroke="' + (MARKER_COLORS[m.kind] || "#999") + '" stroke-dasharray="4 3"><title>'
        + esc(m.label) + "</title></line>");
    }
    series.forEach((s, i) => {
      const color = COLORS[i % COLORS.length];
      out.push('<polyline fill="none" stroke="' + color + '" stroke-width="1.5" points="'
        + s.points.map((p) => sx(p[0]) + "," + sy(p[1])).join(" ") + '"><title>' + esc(s.label) + "</title></polyline>");
      if (s.points.length <= 60) {
        for (const p of s.points) {
          out.push('<circle cx="' + sx(p[0]) + '" cy="' + sy(p[1]) + '" r="2" fill="' + color + '"><title>'
            + esc(xText(p[0], xf)) + ": " + esc(fmt(yf, p[1])) + "</title></circle>");
        }
      }
      if (series.length > 1) {
        out.push('<text x="' + (LEFT + 8 + 110 * i) + '" y="' + (TOP + 10) + '" font-size="10" fill="' + color + '">'
          + esc(s.label) + "</text>");
      }
    });
    out.push("</svg>");
    return out.join("");
  }
  function updateChart(el, body) {
    const spec = JSON.parse(el.dataset.chart);
    const old = el.querySelector("svg");
    if (old) spec.cssClass = old.getAttribute("class");
    const html = chartSvg(spec, body);
    if (el.dataset.rendered !== html) { el.innerHTML = html; el.dataset.rendered = html; }
  }

  // ----- polling -----
  function update(el, body) {
    if (el.dataset.hideWhen) el.hidden = getPath(body, JSON.parse(el.dataset.hideWhen)) !== null;
    else if (el.dataset.chart) updateChart(el, body);
    else if (el.classList.contains("live-table")) updateTable(el, body);
    else updateFields(el, body);
  }
  async function poll() {
    const bySrc = new Map();
    for (const el of document.querySelectorAll("[data-src]")) {
      if (!bySrc.has(el.dataset.src)) bySrc.set(el.dataset.src, []);
      bySrc.get(el.dataset.src).push(el);
    }
    let failed = 0;
    await Promise.all(Array.from(bySrc, async ([src, els]) => {
      try {
        const r = await fetch(src, { headers: { Accept: "application/json" }, cache: "no-store" });
        if (!r.ok) { failed++; return; }
        const body = await r.json();
        for (const el of els) update(el, body);
      } catch (e) {
        failed++;   // the RM is restarting or gone: say so, keep polling
      }
    }));
    const stamp = document.getElementById("updated");
    if (stamp) {
      stamp.textContent = failed ? "update failed at " + clock(new Date()) : "updated " + clock(new Date());
      document.body.dataset.polls = String(Number(document.body.dataset.polls || 0) + 1);
    }
  }
  function start() {
    const ms = Number(document.body.dataset.pollMs) || 2000;
    // A hidden tab does not poll (it would load the RM for nobody); it catches up when shown.
    const loop = async () => { if (!document.hidden) await poll(); setTimeout(loop, ms); };
    setTimeout(loop, ms);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
