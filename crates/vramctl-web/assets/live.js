// The live/history mode: per GPU the memory now and its curve stacked by process (the
// server's downsampled history, then each tick from the event stream), the process table
// with verdicts, marks for leak onsets and kills/reclaims, and one process's own curve.
// Every text from the server (commands, users, reasons) goes into textContent.
"use strict";
(function () {
  const { el, bytes, api, status } = window.vramctl;

  const ZOOMS = [
    ["5 min", 5 * 60e3], ["15 min", 15 * 60e3], ["1 h", 3600e3],
    ["6 h", 6 * 3600e3], ["24 h", 24 * 3600e3], ["All", null],
  ];
  const STACKED = 8;
  // Distinct on white, and in this order readable by most colour-blind viewers.
  const PALETTE = ["#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#8c6d1f", "#5a5a5a", "#9467bd"];
  const OTHERS = "#b8b8b8";

  let S = null;

  function fresh() {
    return {
      root: null, source: null, windowMs: 15 * 60e3, follow: true, range: null,
      recorded: null, bounds: null, stepMs: 0, gpus: new Map(), marks: { onsets: [], audit: [] },
      lastSeq: 0, lastTick: null, selected: null, loading: 0, resize: null,
      detail: null, ticks: 0, visibility: null, retry: null,
    };
  }

  // ---- data --------------------------------------------------------------------------

  function gpuState(uuid) {
    let g = S.gpus.get(uuid);
    if (!g) {
      g = { uuid, index: null, name: null, total: null, t: [], umin: [], umax: [], procs: new Map(), others: null, plot: null, node: null, rows: new Map(), ids: new Map() };
      S.gpus.set(uuid, g);
    }
    return g;
  }

  function resetSeries(g) {
    g.t = []; g.umin = []; g.umax = []; g.procs = new Map(); g.others = null;
  }

  function procLabel(p) {
    const cmd = (p.command || "?").slice(0, 40);
    return cmd + " [" + p.pid + "]";
  }

  // The history answer → each GPU's arrays (times in seconds, as uPlot wants).
  function takeHistory(h) {
    S.bounds = h.bounds;
    S.stepMs = h.step_ms;
    for (const g of S.gpus.values()) resetSeries(g);
    const t = h.t.map((ms) => ms / 1000);
    for (const hg of h.gpus) {
      const g = gpuState(hg.uuid);
      if (g.index === null) g.index = hg.index;
      g.name = g.name || hg.name;
      g.total = g.total || hg.total_bytes;
      g.t = t.slice();
      g.umin = hg.used_min.slice();
      g.umax = hg.used_max.slice();
      for (const p of hg.processes) {
        const key = String(p.pid);
        const have = g.procs.get(key);
        if (have) have.vals = have.vals.map((v, i) => (v === null ? p.max[i] : p.max[i] === null ? v : Math.max(v, p.max[i])));
        else g.procs.set(key, { pid: p.pid, label: procLabel(p), vals: p.max.slice() });
        g.ids.set(key, p.id);
      }
      g.others = hg.others_max ? hg.others_max.slice() : null;
    }
  }

  // One tick into the curves: a new bucket, or merged into the last one (highest and
  // lowest kept) when the chart's buckets are longer than a tick.
  function appendTick(tick) {
    const ts = tick.t_ms / 1000;
    for (const tg of tick.gpus) {
      const g = gpuState(tg.uuid);
      const n = g.t.length;
      const step = S.stepMs / 1000;
      const merge = n > 0 && step > 0 && ts < g.t[n - 1] + step;
      if (n > 0 && ts <= g.t[n - 1] && !merge) continue;
      if (!merge) {
        g.t.push(ts);
        g.umin.push(tg.used_bytes);
        g.umax.push(tg.used_bytes);
        for (const p of g.procs.values()) p.vals.push(null);
        if (g.others) g.others.push(null);
      } else if (tg.used_bytes !== null) {
        const i = n - 1;
        g.umin[i] = g.umin[i] === null ? tg.used_bytes : Math.min(g.umin[i], tg.used_bytes);
        g.umax[i] = g.umax[i] === null ? tg.used_bytes : Math.max(g.umax[i], tg.used_bytes);
      }
      const i = g.t.length - 1;
      for (const p of tg.processes) {
        const key = String(p.pid);
        let s = g.procs.get(key);
        if (!s) {
          s = { pid: p.pid, label: procLabel(p), vals: new Array(g.t.length).fill(null) };
          g.procs.set(key, s);
        }
        if (p.used_bytes !== null) s.vals[i] = s.vals[i] === null ? p.used_bytes : Math.max(s.vals[i], p.used_bytes);
      }
    }
    if (S.follow && S.windowMs !== null) trim(ts - S.windowMs / 1000);
  }

  function trim(fromSec) {
    for (const g of S.gpus.values()) {
      let k = 0;
      while (k < g.t.length && g.t[k] < fromSec) k++;
      if (k === 0) continue;
      g.t.splice(0, k); g.umin.splice(0, k); g.umax.splice(0, k);
      for (const p of g.procs.values()) p.vals.splice(0, k);
      if (g.others) g.others.splice(0, k);
    }
  }

  // The chart's columns: stacked processes (the biggest STACKED by peak, the rest as
  // "others"), drawn top-down so each filled area covers the ones below it.
  function columns(g) {
    const peaks = new Map();
    for (const p of g.procs.values()) {
      let m = 0;
      for (const v of p.vals) if (v !== null && v > m) m = v;
      peaks.set(p, m);
    }
    const procs = Array.from(g.procs.values()).filter((p) => peaks.get(p) > 0)
      .sort((a, b) => peaks.get(b) - peaks.get(a) || a.pid - b.pid);
    const shown = procs.slice(0, STACKED);
    const rest = procs.slice(STACKED);
    const n = g.t.length;
    let others = g.others ? g.others.slice() : null;
    if (rest.length) {
      others = others || new Array(n).fill(null);
      for (const p of rest) for (let i = 0; i < n; i++) if (p.vals[i] !== null) others[i] = (others[i] || 0) + p.vals[i];
    }
    const layers = shown.map((p, k) => ({ label: p.label, color: PALETTE[k % PALETTE.length], vals: p.vals, pid: p.pid }));
    if (others) layers.push({ label: "others (" + rest.length + "+)", color: OTHERS, vals: others, pid: null });
    const stacked = [];
    const acc = new Array(n).fill(null);
    for (const layer of layers) {
      const col = new Array(n);
      for (let i = 0; i < n; i++) {
        const v = layer.vals[i];
        if (v !== null && v !== undefined) acc[i] = (acc[i] || 0) + v;
        col[i] = g.umax[i] === null && acc[i] === null ? null : acc[i];
      }
      stacked.push(col);
    }
    return { layers, stacked };
  }

  // ---- charts ------------------------------------------------------------------------

  function chartWidth(node) {
    return Math.max(260, Math.floor((node && node.clientWidth) || 600) - 4);
  }

  function yValues(u, splits) { return splits.map((v) => bytes(v)); }

  function drawMarks(u, g) {
    const ctx = u.ctx;
    const [x0, x1] = [u.scales.x.min, u.scales.x.max];
    const top = u.bbox.top, h = u.bbox.height;
    const mark = (tSec, color, dash) => {
      if (tSec < x0 || tSec > x1) return;
      const x = Math.round(u.valToPos(tSec, "x", true));
      ctx.save();
      ctx.strokeStyle = color;
      ctx.lineWidth = 2 * devicePixelRatio;
      ctx.setLineDash(dash);
      ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + h); ctx.stroke();
      ctx.restore();
    };
    for (const o of S.marks.onsets) if (o.gpu === g.uuid) mark(o.t_ms / 1000, "#a40e26", [6 * devicePixelRatio, 4 * devicePixelRatio]);
    for (const a of S.marks.audit) mark(a.t_ms / 1000, a.action === "reclaim" ? "#0550ae" : "#1b1f24", []);
  }

  function buildPlot(g) {
    const { layers, stacked } = columns(g);
    const series = [{ label: "time" }];
    const data = [g.t];
    // Top of the stack first: each fill reaches down to zero and the next one covers it.
    for (let k = layers.length - 1; k >= 0; k--) {
      series.push({ label: layers[k].label, stroke: layers[k].color, fill: layers[k].color + "cc", width: 1, points: { show: false }, value: (u, v) => bytes(v) });
      data.push(stacked[k]);
    }
    series.push({ label: "used (highest)", stroke: "#1b1f24", width: 1.5, value: (u, v) => bytes(v) });
    data.push(g.umax);
    series.push({ label: "used (lowest)", stroke: "#1b1f24", dash: [4, 4], width: 1, points: { show: false }, value: (u, v) => bytes(v) });
    data.push(g.umin);
    const node = g.node.chart;
    const opts = {
      width: chartWidth(node), height: 240, series, legend: { live: true },
      cursor: { drag: { x: true, y: false, setScale: false }, sync: { key: "vramctl" } },
      scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(max || 0, g.total || 0, 1 << 30)] } },
      axes: [{ space: 90 }, { values: yValues, size: 80 }],
      hooks: {
        draw: [(u) => drawMarks(u, g)],
        setSelect: [(u) => {
          if (u.select.width < 5) return;
          const from = u.posToVal(u.select.left, "x") * 1000;
          const to = u.posToVal(u.select.left + u.select.width, "x") * 1000;
          u.setSelect({ left: 0, width: 0, top: 0, height: 0 }, false);
          zoomTo(Math.floor(from), Math.ceil(to));
        }],
      },
    };
    if (g.plot) g.plot.destroy();
    node.replaceChildren();
    g.plot = new uPlot(opts, data, node);
    g.shape = layers.map((l) => l.label).join("\u0000");
    describe(g);
  }

  function redraw(g) {
    if (!g.node) return;
    const { layers, stacked } = columns(g);
    const shape = layers.map((l) => l.label).join("\u0000");
    if (!g.plot || shape !== g.shape) { buildPlot(g); return; }
    const data = [g.t];
    for (let k = layers.length - 1; k >= 0; k--) data.push(stacked[k]);
    data.push(g.umax, g.umin);
    g.plot.setData(data);
    describe(g);
  }

  // What the chart shows, in words, for screen readers (the canvas is an image).
  function describe(g) {
    const n = g.t.length;
    const peak = g.umax.reduce((m, v) => (v !== null && v > m ? v : m), 0);
    const when = (s) => new Date(s * 1000).toLocaleString();
    const marks = S.marks.onsets.filter((o) => o.gpu === g.uuid).length + S.marks.audit.length;
    g.node.chart.setAttribute("aria-label", n
      ? "Memory of GPU " + g.index + " from " + when(g.t[0]) + " to " + when(g.t[n - 1]) + ": peak " + bytes(peak) + " of " + bytes(g.total) + ", " + g.procs.size + " processes, " + marks + " marks"
      : "Memory of GPU " + g.index + ": no samples in this range");
    g.node.chart.dataset.points = String(n);
  }

  // ---- the process table ---------------------------------------------------------------

  function where(p) {
    return [p.container && "container " + p.container, p.pod && "pod " + p.pod, p.job && "job " + p.job].filter(Boolean).join(", ") || "—";
  }

  function verdictText(p) {
    if (!p.verdict) return "not judged yet";
    return p.verdict + (p.reason ? ": " + p.reason : "");
  }

  // A process's OOMs (its agent's count, the first one's cause): "" when it had none.
  function oomText(p) {
    const o = p.oom;
    if (!o) return "";
    const n = o.count === 1 ? "1 OOM" : o.count + " OOMs";
    if (o.state === "classifying") return n + ": classifying…";
    if (o.state === "classified" && o.cause) return n + ": " + o.cause;
    return n + ": cause unknown";
  }

  // The detail's sentences on them: cause, fix (or that none works), why.
  function oomDetail(p) {
    const o = p.oom;
    if (!o) return null;
    const at = new Date(o.oom_at_unix_ms || o.seen_at_unix_ms).toLocaleTimeString();
    const parts = ["Out of memory: " + oomText(p) + " (first at " + at + ")."];
    if (o.state === "classified") parts.push("Fix: " + (o.fix || "none — nothing the process can set avoids it") + ".");
    if (o.why) parts.push(o.why);
    return el("p", { class: "oom", text: parts.join(" ") });
  }

  const HEAD = [["PID", "num"], ["User", ""], ["Command", ""], ["Container / pod / job", "wide"], ["Memory", "num"], ["Allocated", "num wide"], ["Cached", "num wide"], ["Verdict", ""]];

  // Columns after the PID: [text, class].
  function texts(p) {
    return [
      [p.user || "—", ""],
      [p.command || "—", "cmd"],
      [where(p), "wide"],
      [bytes(p.used_bytes), "num"],
      [bytes(p.allocated_bytes), "num wide"],
      [bytes(p.cached_bytes), "num wide"],
      // A process's OOMs beside its verdict: no column that is empty for everyone else.
      [verdictText(p) + (p.oom ? " · " + oomText(p) : ""), p.oom ? "oom" : p.verdict ? "verdict-" + p.verdict : ""],
    ];
  }

  function newRow(g, p) {
    const pidCell = el("td", { class: "num" }, el("button", { type: "button", class: "link", "data-pid": p.pid, "aria-label": "Details of process " + p.pid, onclick: () => select(g.uuid, p.pid) }, String(p.pid)));
    const row = el("tr", { "data-pid": String(p.pid) }, [pidCell, ...texts(p).map(([text, cls]) => el("td", { class: cls || null, text }))]);
    row.texts = texts(p).map(([text, cls]) => text + "\u0000" + cls);
    return row;
  }

  // Rows are kept by PID and only their changed cells rewritten (text only, no new nodes),
  // so a focused button keeps its focus while ticks arrive, and a steady table costs
  // nothing but the comparison.
  function updateTable(g, tg) {
    const body = g.node.tbody;
    const seen = new Set();
    const order = [];
    for (const p of tg.processes) {
      const key = String(p.pid);
      seen.add(key);
      let row = g.rows.get(key);
      if (!row) {
        row = newRow(g, p);
        g.rows.set(key, row);
      } else {
        const fresh = texts(p);
        for (let c = 0; c < fresh.length; c++) {
          const sig = fresh[c][0] + "\u0000" + fresh[c][1];
          if (row.texts[c] === sig) continue;
          row.texts[c] = sig;
          const cell = row.children[c + 1];
          cell.textContent = fresh[c][0];
          cell.className = fresh[c][1];
        }
      }
      const selected = !!(S.selected && S.selected.uuid === g.uuid && S.selected.pid === p.pid);
      if (row.classList.contains("selected") !== selected) row.classList.toggle("selected", selected);
      order.push(row);
    }
    for (const [key, row] of g.rows) if (!seen.has(key)) { row.remove(); g.rows.delete(key); }
    let same = body.children.length === order.length;
    for (let i = 0; same && i < order.length; i++) same = body.children[i] === order[i];
    if (!same) order.forEach((row, i) => { if (body.children[i] !== row) body.insertBefore(row, body.children[i] || null); });
    const line = tg.error
      ? "Cannot read this GPU: " + tg.error
      : bytes(tg.used_bytes) + " of " + bytes(tg.total_bytes) + " used · " + tg.processes.length + " processes";
    if (g.node.now.textContent !== line) g.node.now.textContent = line;
  }

  function gpuNode(g) {
    const tbody = el("tbody");
    const chart = el("div", { class: "chart", role: "img", "aria-label": "Memory chart" });
    const now = el("p", { class: "now" });
    const title = el("h2", { text: "GPU " + g.index + " · " + (g.name || "") + " · " + g.uuid });
    const table = el("div", { class: "tablewrap" });
    const node = el("article", { class: "gpu", "aria-label": "GPU " + g.index, "data-uuid": g.uuid }, [
      title, now, chart, table]);
    table.append(el("table", { class: "procs" }, [
        el("caption", { text: "Processes on GPU " + g.index }),
        el("thead", null, el("tr", null, HEAD.map(([h, cls]) => el("th", { scope: "col", class: cls || null, text: h })))),
        tbody,
      ]));
    g.node = { node, chart, now, tbody, title, table };
    return node;
  }

  function ensureNodes() {
    const box = S.root.querySelector(".gpus");
    const list = Array.from(S.gpus.values()).sort((a, b) => (a.index ?? 1e9) - (b.index ?? 1e9) || a.uuid.localeCompare(b.uuid));
    for (const g of list) {
      if (g.node) continue;
      box.append(gpuNode(g));
      if (S.visibility) S.visibility.observe(g.node.chart);
    }
  }

  // ---- one process ---------------------------------------------------------------------

  async function select(uuid, pid) {
    S.selected = { uuid, pid };
    const g = S.gpus.get(uuid);
    for (const gg of S.gpus.values()) for (const [key, row] of gg.rows) row.classList.toggle("selected", gg === g && key === String(pid));
    const box = S.root.querySelector(".detail");
    box.hidden = false;
    const p = S.lastTick && (S.lastTick.gpus.find((x) => x.uuid === uuid) || { processes: [] }).processes.find((x) => x.pid === pid);
    const heading = el("h2", { id: "detail-title", tabindex: "-1", text: "Process " + pid + (p && p.command ? " · " + p.command : "") });
    const facts = el("p", { text: p ? "User " + (p.user || "—") + " · " + where(p) + " · memory " + bytes(p.used_bytes) + " · allocated " + bytes(p.allocated_bytes) + " · cached " + bytes(p.cached_bytes) + " · " + verdictText(p) : "Not on the GPU now." });
    const chart = el("div", { class: "chart", role: "img", "aria-label": "Memory of process " + pid });
    const close = el("button", { type: "button", onclick: () => { box.hidden = true; S.selected = null; if (S.detail) S.detail.destroy(); S.detail = null; } }, "Close");
    const oom = p ? oomDetail(p) : null;
    box.replaceChildren(...[heading, facts, oom, chart, el("div", { class: "controls" }, close)].filter(Boolean));
    heading.focus();
    let t = g ? g.t : [], used = g && g.procs.get(String(pid)) ? g.procs.get(String(pid)).vals : [];
    let allocated = null, reserved = null;
    const id = g && g.ids.get(String(pid));
    if (S.recorded && id !== undefined) {
      try {
        const h = await api("/api/process?" + rangeQuery() + "&id=" + id + "&gpu=" + encodeURIComponent(uuid));
        const hg = h.gpus && h.gpus[0];
        if (hg && hg.processes[0]) {
          t = h.t.map((ms) => ms / 1000);
          used = hg.processes[0].max;
          allocated = hg.processes[0].allocated_max;
          reserved = hg.processes[0].reserved_max;
        }
      } catch (e) { status("Cannot read the process's history: " + e.message); }
    }
    const series = [{ label: "time" }, { label: "memory", stroke: "#0072b2", width: 2, value: (u, v) => bytes(v) }];
    const data = [t, used];
    if (allocated && allocated.some((v) => v !== null)) { series.push({ label: "allocated (agent)", stroke: "#009e73", width: 1.5, points: { show: false }, value: (u, v) => bytes(v) }); data.push(allocated); }
    if (reserved && reserved.some((v) => v !== null)) { series.push({ label: "reserved (agent)", stroke: "#e69f00", width: 1.5, points: { show: false }, value: (u, v) => bytes(v) }); data.push(reserved); }
    if (S.detail) S.detail.destroy();
    S.detail = new uPlot({ width: chartWidth(box), height: 200, series, scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(max, 1)] } }, axes: [{ space: 90 }, { values: yValues, size: 80 }], cursor: { sync: { key: "vramctl" } } }, data, chart);
    chart.dataset.points = String(t.length);
  }

  // ---- loading -------------------------------------------------------------------------

  function rangeQuery() {
    const width = chartWidth(S.root.querySelector(".gpus"));
    const points = Math.min(2000, Math.max(50, Math.floor(width / 2)));
    if (S.range) return "from=" + S.range.from + "&to=" + S.range.to + "&points=" + points;
    if (S.windowMs === null) return "points=" + points;
    // The last windowMs before the latest sample, as the server knows it.
    return "window=" + S.windowMs + "&points=" + points;
  }

  function loadMarks(ticket, from, to) {
    // The marks (the history's leak scan of the range) come when they come, and redraw.
    api("/api/marks?from=" + Math.floor(from) + "&to=" + Math.ceil(to)).then((marks) => {
      if (!S || ticket !== S.loading || !S.root) return;
      S.marks = marks;
      for (const g of S.gpus.values()) if (g.plot) { g.plot.redraw(false); describe(g); }
      S.root.dataset.marks = String(marks.onsets.length + marks.audit.length);
    }).catch((e) => status("Cannot read the marks: " + e.message));
  }

  async function load() {
    const ticket = ++S.loading;
    const started = performance.now();
    status("Loading…");
    try {
      // The latest tick and the history at once: neither waits for the other.
      const [now, h] = await Promise.all([
        S.lastTick ? Promise.resolve(S.lastTick) : api("/api/now").catch((e) => { status("No sample yet: " + e.message); return null; }),
        api("/api/history?" + rangeQuery()),
      ]);
      if (ticket !== S.loading || !S.root) return;
      if (now && (!S.lastTick || now.seq > S.lastTick.seq)) S.lastTick = now;
      S.recorded = h.recorded;
      if (h.recorded) takeHistory(h);
      else { S.stepMs = 0; for (const g of S.gpus.values()) resetSeries(g); }
      if (S.follow) {
        // The ticks the recorder has not written yet (and, without a recording, all the
        // server holds).
        const after = h.recorded && h.bounds ? "?after=" + h.bounds[1] : "";
        const recent = await api("/api/recent" + after);
        if (ticket !== S.loading || !S.root) return;
        for (const tick of recent) appendTick(tick);
      }
      if (S.lastTick) for (const tg of S.lastTick.gpus) { const g = gpuState(tg.uuid); g.index = tg.index; g.name = tg.name; g.total = tg.total_bytes; }
      ensureNodes();
      for (const g of S.gpus.values()) { if (g.plot) g.plot.destroy(); g.plot = null; g.dirty = true; }
      redrawVisible(true);
      if (S.lastTick) for (const tg of S.lastTick.gpus) updateTable(gpuState(tg.uuid), tg);
      for (const g of S.gpus.values()) {
        const absent = !(S.lastTick && S.lastTick.gpus.some((x) => x.uuid === g.uuid));
        if (g.node) g.node.table.hidden = absent;
        if (g.node && absent) g.node.now.textContent = "Not in the latest sample: its recorded history only.";
      }
      performance.mark("vramctl-charts");
      S.root.dataset.loadedMs = String(Math.round(performance.now() - started));
      status((h.recorded ? "History" : "Since the server started (no recording)") + (S.follow ? " · live" : " · paused: zoomed into the past") + (S.lastTick ? " · last sample " + new Date(S.lastTick.t_ms).toLocaleTimeString() : ""));
      const first = Array.from(S.gpus.values()).find((g) => g.t.length);
      if (h.recorded) loadMarks(ticket, h.from_ms, Math.max(h.to_ms, S.lastTick ? S.lastTick.t_ms : 0));
      else if (first) loadMarks(ticket, first.t[0] * 1000, first.t[first.t.length - 1] * 1000);
    } catch (e) {
      if (ticket === S.loading) status("Cannot load the history: " + e.message);
    }
  }

  // Charts off screen are not drawn on every tick: they are marked and drawn when they
  // scroll into view (the page's CPU at a 1 s tick with eight GPUs).
  function redrawVisible(all) {
    for (const g of S.gpus.values()) {
      if (!g.node || !g.dirty) continue;
      if (!all && g.visible === false) continue;
      if (all || g.visible !== false) { g.dirty = false; redraw(g); }
    }
  }

  function zoomTo(from, to) {
    // Every chart shares the cursor, so one drag selects on all of them.
    if (S.range && S.range.from === from && S.range.to === to) return;
    S.follow = false;
    S.range = { from, to };
    window.vramctl.setParams("live", { from, to });
    syncControls();
    load();
  }

  function setZoom(windowMs) {
    S.windowMs = windowMs;
    S.follow = true;
    S.range = null;
    window.vramctl.setParams("live", windowMs === 15 * 60e3 ? null : { window: windowMs === null ? "all" : windowMs });
    syncControls();
    load();
  }

  function syncControls() {
    for (const b of S.root.querySelectorAll("button[data-zoom]")) b.setAttribute("aria-pressed", String(S.range === null && String(S.windowMs) === b.dataset.zoom));
    const live = S.root.querySelector("button[data-live]");
    live.setAttribute("aria-pressed", String(S.follow));
    live.textContent = S.follow ? "Live" : "Back to live";
  }

  function onTick(event) {
    let tick;
    try { tick = JSON.parse(event.data); } catch (e) { return; }
    // A reconnected stream replays from Last-Event-ID; a tick seen already is skipped.
    if (tick.seq <= S.lastSeq && S.lastSeq - tick.seq < 1e6) return;
    S.lastSeq = tick.seq;
    S.lastTick = tick;
    S.ticks++;
    S.root.dataset.seq = String(tick.seq);
    S.root.dataset.tickMs = String(tick.t_ms);
    if (tick.down) { status("The GPUs cannot be read: " + tick.down); return; }
    let added = false;
    for (const tg of tick.gpus) if (!S.gpus.has(tg.uuid) || !S.gpus.get(tg.uuid).node) { gpuState(tg.uuid).index = tg.index; gpuState(tg.uuid).name = tg.name; added = true; }
    if (added) ensureNodes();
    for (const tg of tick.gpus) { const g = gpuState(tg.uuid); if (g.node.table.hidden) g.node.table.hidden = false; updateTable(g, tg); }
    if (S.follow && S.recorded !== null) {
      appendTick(tick);
      for (const g of S.gpus.values()) g.dirty = true;
      redrawVisible(false);
    }
    const last = document.getElementById("live-last");
    if (last) last.textContent = "Last sample " + new Date(tick.t_ms).toLocaleTimeString() + " (tick " + tick.seq + ")";
    // How long after its sample was taken the tick was on screen (table and charts
    // updated; the server and the browser on one machine read one clock).
    S.root.dataset.lagMs = String(Date.now() - tick.t_ms);
  }

  // EventSource reconnects by itself (with Last-Event-ID) when a stream ends; it gives up
  // on an error answer (503: too many streams), so then the page tries again later, saying
  // where it left off.
  function connect() {
    const source = new EventSource("/api/events" + (S.lastSeq ? "?last=" + S.lastSeq : ""));
    source.addEventListener("tick", onTick);
    source.addEventListener("error", () => {
      if (!S || S.source !== source) return;
      status("Live stream interrupted; reconnecting…");
      if (source.readyState === EventSource.CLOSED) {
        source.close();
        S.retry = setTimeout(() => { if (S && S.source === source) connect(); }, 5000);
      }
    });
    source.addEventListener("open", () => { if (S && S.source === source && S.recorded !== null) status(S.follow ? "Live" : "Paused: zoomed into the past"); });
    S.source = source;
  }

  function mount(root, params) {
    S = fresh();
    S.root = root;
    const from = Number(params.get("from")), to = Number(params.get("to"));
    if (params.has("from") && params.has("to") && Number.isFinite(from) && Number.isFinite(to) && from < to) {
      S.range = { from, to };
      S.follow = false;
    }
    if (params.get("window") === "all") S.windowMs = null;
    else if (Number(params.get("window")) > 0) S.windowMs = Number(params.get("window"));
    const zooms = ZOOMS.map(([label, ms]) => el("button", { type: "button", "data-zoom": String(ms), "aria-pressed": "false", onclick: () => setZoom(ms) }, label));
    const live = el("button", { type: "button", "data-live": "1", "aria-pressed": "true", onclick: () => setZoom(S.windowMs) }, "Live");
    root.append(
      el("div", { class: "controls", role: "group", "aria-label": "Time range" }, [el("span", { text: "Range:" }), ...zooms, live, el("span", { id: "live-last", class: "status", "aria-live": "off" })]),
      el("p", { class: "hint", text: "Drag across a chart to zoom in; the buttons zoom out. Red dashed lines: leak onsets; black: kills; blue: reclaims." }),
      el("div", { class: "gpus" }),
      el("section", { class: "detail", "aria-labelledby": "detail-title", hidden: true }),
    );
    syncControls();
    connect();
    load();
    S.visibility = new IntersectionObserver((entries) => {
      for (const entry of entries) {
        const g = Array.from(S.gpus.values()).find((x) => x.node && x.node.chart === entry.target);
        if (!g) continue;
        g.visible = entry.isIntersecting;
        if (g.visible && g.dirty) { g.dirty = false; redraw(g); }
      }
    });
    for (const g of S.gpus.values()) if (g.node) S.visibility.observe(g.node.chart);
    S.resize = new ResizeObserver(() => {
      for (const g of S.gpus.values()) if (g.plot) g.plot.setSize({ width: chartWidth(g.node.chart), height: 240 });
    });
    S.resize.observe(root);
  }

  function unmount() {
    if (!S) return;
    if (S.source) S.source.close();
    if (S.retry) clearTimeout(S.retry);
    if (S.resize) S.resize.disconnect();
    if (S.visibility) S.visibility.disconnect();
    for (const g of S.gpus.values()) if (g.plot) g.plot.destroy();
    if (S.detail) S.detail.destroy();
    S = null;
  }

  // Read-only view of the charts' contents, for tests and the curious (the console).
  window.vramctl.liveCharts = () => S ? Array.from(S.gpus.values()).map((g) => ({
    uuid: g.uuid, index: g.index, points: g.t.length, from: g.t[0], to: g.t[g.t.length - 1],
    series: g.plot ? g.plot.series.slice(1).map((s) => s.label) : [],
    pids: Array.from(g.procs.values()).filter((p) => p.vals.some((v) => v !== null && v > 0)).map((p) => p.pid),
    peak: g.umax.reduce((m, v) => (v !== null && v > m ? v : m), 0),
    scale: g.plot ? [g.plot.scales.x.min, g.plot.scales.x.max] : null,
  })) : [];

  window.vramctl.registerMode("live", { mount, unmount });
})();
