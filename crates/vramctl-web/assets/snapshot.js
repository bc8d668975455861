// The snapshot mode: the allocator snapshots given to the server (`vramctl snapshot view
// FILE`, `serve --snapshot FILE`). Everything here is drawn from what the server computed
// (`/api/snapshot/...`): the timeline downsampled to the chart's width, the largest
// allocations as bands, the rest as "other", the segments and blocks at one event, the OOM
// events with the summary's lines. A snapshot is hostile input: its strings (file and
// function names) go into textContent only.
"use strict";
(function () {
  const { el, bytes, api, status } = window.vramctl;
  const BANDS = 400;
  const MAX_SEGMENT_ROWS = 1500;
  // More OOM events in range than this are drawn as ticks, not lines; more than
  // OOM_LISTED are listed under a disclosure.
  const FULL_OOM_LINES = 20;
  const OTHER_FILL = "rgba(140,149,159,0.45)";
  const OOM_LISTED = 5;
  let root = null;
  let chart = null;
  let files = [];
  let current = { file: 0, device: 0 };
  let tl = null; // the timeline answer shown
  let layout = null; // per band: bottoms per bucket
  let hoverBand = -1;
  let resizeObserver = null;
  const parts = {};

  function color(i, alpha) {
    // A stable hue per stack, spread by the golden angle.
    const hue = (i * 137.508) % 360;
    return "hsla(" + hue.toFixed(1) + ",62%,52%," + alpha + ")";
  }

  // A stack as lines, innermost first: the Python frames (what a user wrote or called),
  // then the first native frames and how many more (a C++ stack is dozens deep).
  const NATIVE_SHOWN = 6;
  function frameText(answer, stackIndex) {
    const stack = answer.stacks[stackIndex];
    if (!stack || stack.frames.length === 0) return ["(no stack recorded)"];
    const frames = stack.frames.map((f) => answer.frames[f]);
    const line = (fr) => "  " + fr.name + "  " + fr.filename + ":" + fr.line;
    const python = frames.filter((fr) => fr.filename.endsWith(".py"));
    const native = frames.filter((fr) => !fr.filename.endsWith(".py"));
    const lines = [];
    if (python.length) lines.push("Python frames, innermost first:", ...python.map(line));
    if (native.length) {
      lines.push(native.length + " native frames" + (native.length > NATIVE_SHOWN ? ", the first " + NATIVE_SHOWN : "") + ":");
      lines.push(...native.slice(0, NATIVE_SHOWN).map(line));
    }
    if (stack.frames_omitted > 0) lines.push("… " + stack.frames_omitted + " deeper frames not sent");
    return lines;
  }

  // Long lines (stacks, OOM explanations) wrap inside the page: style set through the
  // CSSOM, which the page's policy allows (no inline style attribute).
  function wrap(pre) {
    pre.style.whiteSpace = "pre-wrap";
    pre.style.overflowWrap = "anywhere";
    pre.style.fontSize = "12px";
    return pre;
  }

  function eventLabel(e) {
    return e === null || e === undefined ? "—" : "event " + e;
  }

  // Bottom of each band in each bucket it is live in: the bands stacked in the order they
  // were made (what PyTorch's memory_viz does with its allocations), "other" on top of them
  // up to the live bytes. `layout.other`: the bottom of "other" per bucket.
  function computeLayout(t) {
    const n = t.buckets.event.length;
    const running = new Float64Array(n);
    const bands = t.bands.map((b) => {
      const bottoms = new Float64Array(Math.max(0, b.end_bucket - b.first_bucket));
      for (let k = b.first_bucket; k < b.end_bucket && k < n; k++) {
        bottoms[k - b.first_bucket] = running[k];
        running[k] += b.size_bytes;
      }
      return bottoms;
    });
    bands.other = running;
    return bands;
  }

  function drawBands(u) {
    if (!tl || !layout) return;
    const ctx = u.ctx;
    const xs = tl.buckets.event;
    ctx.save();
    ctx.beginPath();
    ctx.rect(u.bbox.left, u.bbox.top, u.bbox.width, u.bbox.height);
    ctx.clip();
    // "Other": between the bands' top and the live bytes, drawn as steps like the bands.
    {
      const n = xs.length;
      const x = (k) => (k < n ? u.valToPos(xs[k], "x", true) : u.valToPos(xs[n - 1], "x", true) + 1);
      ctx.beginPath();
      for (let k = 0; k < n; k++) {
        const y = u.valToPos(layout.other[k] + tl.buckets.other_bytes[k], "y", true);
        ctx.lineTo(x(k), y);
        ctx.lineTo(x(k + 1), y);
      }
      for (let k = n - 1; k >= 0; k--) {
        const y = u.valToPos(layout.other[k], "y", true);
        ctx.lineTo(x(k + 1), y);
        ctx.lineTo(x(k), y);
      }
      ctx.closePath();
      ctx.fillStyle = OTHER_FILL;
      ctx.fill();
    }
    tl.bands.forEach((b, i) => {
      const bottoms = layout[i];
      if (bottoms.length === 0) return;
      ctx.beginPath();
      // Top edge left to right, bottom edge back; a band of one bucket gets the width of
      // that bucket's step.
      const x = (k) => u.valToPos(xs[k], "x", true);
      const last = b.first_bucket + bottoms.length - 1;
      const xEnd = last + 1 < xs.length ? x(last + 1) : x(last) + 1;
      for (let k = b.first_bucket; k <= last; k++) {
        const y = u.valToPos(bottoms[k - b.first_bucket] + b.size_bytes, "y", true);
        ctx.lineTo(x(k), y);
        ctx.lineTo(k < last ? x(k + 1) : xEnd, y);
      }
      for (let k = last; k >= b.first_bucket; k--) {
        const y = u.valToPos(bottoms[k - b.first_bucket], "y", true);
        ctx.lineTo(k < last ? x(k + 1) : xEnd, y);
        ctx.lineTo(x(k), y);
      }
      ctx.closePath();
      // By the allocation's place, as memory_viz does: neighbours differ.
      ctx.fillStyle = color(i, i === hoverBand ? 0.95 : 0.7);
      ctx.fill();
    });
    // OOM events: red vertical lines; when there are many in range, ticks along the top
    // only, so that they do not hide the memory they explain.
    const ooms = tl.oom.filter((o) => o.event >= tl.from && o.event < tl.to);
    const full = ooms.length <= FULL_OOM_LINES;
    ctx.strokeStyle = "#cf222e";
    ctx.lineWidth = (full ? 2 : 1) * devicePixelRatio;
    const tick = 10 * devicePixelRatio;
    for (const o of ooms) {
      const px = u.valToPos(o.event, "x", true);
      ctx.beginPath();
      ctx.moveTo(px, u.bbox.top);
      ctx.lineTo(px, full ? u.bbox.top + u.bbox.height : u.bbox.top + tick);
      ctx.stroke();
    }
    ctx.restore();
  }

  // The band under the cursor at bucket `k` and height `y` bytes, or -1 ("other" or none).
  function bandAt(k, y) {
    if (!tl || k === null || k === undefined) return -1;
    for (let i = 0; i < tl.bands.length; i++) {
      const b = tl.bands[i];
      if (k < b.first_bucket || k >= b.end_bucket) continue;
      const bottom = layout[i][k - b.first_bucket];
      if (y >= bottom && y < bottom + b.size_bytes) return i;
    }
    return -1;
  }

  function showHover(u) {
    const k = u.cursor.idx;
    if (!tl || k === null || k === undefined || u.cursor.top < 0) return;
    const y = u.posToVal(u.cursor.top, "y");
    const i = bandAt(k, y);
    const bk = tl.buckets;
    const head = "event " + bk.event[k] + ": live " + bytes(bk.live_bytes[k]) +
      " (min " + bytes(bk.live_min_bytes[k]) + " in this bucket), reserved " + bytes(bk.reserved_bytes[k]);
    const lines = [head];
    if (i >= 0) {
      const b = tl.bands[i];
      lines.push("allocation of " + bytes(b.size_bytes) + ": made at " +
        (b.alloc_event === null ? "before the trace" : eventLabel(b.alloc_event)) + ", freed at " +
        (b.free_event === null ? "— (live at the end)" : eventLabel(b.free_event)));
      lines.push(...frameText(tl, b.stack));
    } else if (y >= layout.other[k] && y < layout.other[k] + bk.other_bytes[k]) {
      lines.push("other: " + bytes(bk.other_bytes[k]) + " in allocations not drawn as bands (" +
        tl.bands.length + " of the " + tl.allocations_in_range + " in this range are; zoom in to see the brief ones)");
    }
    if (i !== hoverBand) {
      hoverBand = i;
      u.redraw(false, false);
    }
    parts.hover.textContent = lines.join("\n");
  }

  function chartSize() {
    const width = Math.max(320, (parts.chartBox.clientWidth || root.clientWidth || 800) - 4);
    return { width, height: Math.max(260, Math.min(480, Math.round(width * 0.4))) };
  }

  function makeChart() {
    const size = chartSize();
    let downX = null;
    const opts = {
      width: size.width,
      height: size.height,
      // Bytes from 0: the bands start there.
      scales: { x: { time: false }, y: { range: (u, min, max) => [0, Math.max(1, max) * 1.05] } },
      cursor: { drag: { x: true, y: false, setScale: false }, points: { show: false } },
      legend: { show: true },
      series: [
        { label: "event", value: (u, v) => (v === null ? "—" : String(v)) },
        { label: "live (max per bucket)", stroke: "#1b1f24", width: 1.5, value: (u, v) => bytes(v) },
        { label: "live (min per bucket)", stroke: "#57606a", width: 1, dash: [4, 4], value: (u, v) => bytes(v) },
        { label: "reserved", stroke: "#0550ae", width: 2, value: (u, v) => bytes(v) },
      ],
      axes: [
        { label: "event", values: (u, vals) => vals.map((v) => String(Math.round(v))) },
        { size: 80, values: (u, vals) => vals.map((v) => bytes(v)) },
      ],
      hooks: {
        // Bands and "other" under the lines: drawn after the axes, before the series.
        drawAxes: [drawBands],
        setCursor: [showHover],
        setSelect: [(u) => {
          if (u.select.width < 4) return;
          const from = Math.floor(u.posToVal(u.select.left, "x"));
          const to = Math.ceil(u.posToVal(u.select.left + u.select.width, "x")) + 1;
          u.setSelect({ left: 0, width: 0, top: 0, height: 0 }, false);
          loadTimeline(Math.max(0, from), to);
        }],
        ready: [(u) => {
          u.over.addEventListener("mousedown", (e) => { downX = e.clientX; });
          u.over.addEventListener("mouseup", (e) => {
            if (downX !== null && Math.abs(e.clientX - downX) < 3 && u.cursor.idx !== null && tl) {
              loadState(tl.buckets.event[u.cursor.idx]);
            }
            downX = null;
          });
        }],
      },
    };
    chart = new uPlot(opts, dataOf(tl), parts.chartBox);
  }

  function dataOf(t) {
    if (!t) return [[], [], [], []];
    const b = t.buckets;
    return [b.event, b.live_bytes, b.live_min_bytes, b.reserved_bytes];
  }

  async function loadTimeline(from, to) {
    const width = Math.min(4000, Math.max(200, Math.round(chartSize().width)));
    let q = "/api/snapshot/timeline?file=" + current.file + "&device=" + current.device +
      "&width=" + width + "&bands=" + BANDS;
    if (from !== undefined) q += "&from=" + from;
    if (to !== undefined) q += "&to=" + to;
    status("Loading the timeline…");
    try {
      const t = await api(q);
      if (!root) return;
      tl = t;
      layout = computeLayout(t);
      hoverBand = -1;
      if (!chart) makeChart();
      else chart.setData(dataOf(t), true);
      parts.range.textContent = "Events " + t.from + " to " + (t.to - 1) + " of " + t.events +
        " · " + t.buckets.event.length + " buckets · " + t.bands.length + " of " +
        t.allocations_in_range + " allocations drawn as bands (the most bytes × time) · peak " + bytes(t.peak_live_bytes) +
        " at event " + t.peak_event + (t.replayed ? "" : " · the trace did not replay cleanly: approximate");
      parts.reset.disabled = t.from === 0 && t.to === t.events;
      renderOoms(t);
      // The address keeps the zoom, so a link shows the same range.
      if (window.vramctl.setParams) {
        window.vramctl.setParams("snapshot", t.from === 0 && t.to === t.events ? null
          : { file: current.file, device: current.device, from: t.from, to: t.to });
      }
      // For tests and scripts: what is drawn.
      Object.assign(root.dataset, { from: t.from, to: t.to, buckets: t.buckets.event.length, bands: t.bands.length, loaded: Date.now() });
      status("");
    } catch (e) {
      status("Cannot load the timeline: " + e.message);
    }
  }

  function renderOoms(t) {
    if (t.oom.length === 0) {
      parts.oom.replaceChildren(el("p", { text: "No OOM event in this device's trace." }));
      return;
    }
    const items = t.oom.map((o) => el("li", null, [
      el("button", { type: "button", class: "link", text: "State at event " + o.event, onclick: () => loadState(o.event) }),
      wrap(el("pre", { class: "ooms", text: [o.line || ("oom at event " + o.event + ": older than the events the summary measures"), o.advice ? "advice: " + o.advice : null].filter(Boolean).join("\n") })),
    ]));
    const more = items.length > OOM_LISTED
      ? el("details", null, [el("summary", { text: (items.length - OOM_LISTED) + " more OOM events" }), el("ul", null, items.slice(OOM_LISTED))])
      : null;
    parts.oom.replaceChildren(...[el("h2", { text: "OOM events (" + t.oom.length + ")" }), el("ul", null, items.slice(0, OOM_LISTED)), more].filter(Boolean));
  }

  const STATE_COLORS = { active_allocated: null, active_pending_free: "#d4a72c", inactive: "#eaeef2", unknown: "#8c959f" };

  async function loadState(event) {
    if (event === undefined || event === null) return;
    status("Replaying to event " + event + "…");
    try {
      const s = await api("/api/snapshot/state?file=" + current.file + "&device=" + current.device + "&event=" + event);
      if (!root) return;
      renderState(s);
      status("");
    } catch (e) {
      status("Cannot show event " + event + ": " + e.message);
    }
  }

  function renderState(s) {
    parts.eventInput.value = String(s.event);
    const e = s.entry;
    const head = "After event " + s.event + (e ? " (" + e.action + (e.size_bytes ? " " + bytes(e.size_bytes) : "") +
      (e.addr !== null ? " at 0x" + e.addr.toString(16) : "") + ", stream " + e.stream + ")" : "") +
      ": live " + bytes(s.live_bytes) + ", reserved " + bytes(s.reserved_bytes) + ", free " + bytes(s.free_bytes) +
      " (largest free block " + bytes(s.largest_free_block_bytes) + "), " + s.segments_total + " segments" +
      (s.segments_omitted ? " (" + s.segments_omitted + " not sent)" : "") +
      (s.blocks_omitted ? ", " + s.blocks_omitted + " blocks not sent" : "") +
      (s.replayed ? "" : " · approximate: the trace did not replay cleanly");
    const info = el("pre", { class: "hover", text: e ? frameText(s, e.stack).join("\n") : "" });
    const rows = s.segments.slice(0, MAX_SEGMENT_ROWS);
    const rowH = 14, labelW = 170;
    const width = Math.max(320, (parts.segBox.clientWidth || 800) - 4);
    const canvas = el("canvas", { role: "img", "aria-label": "Segments and their blocks after event " + s.event + ": " + s.segments_total + " segments" });
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(Math.max(1, rows.length) * rowH * dpr);
    canvas.style.width = width + "px";
    canvas.style.height = Math.max(1, rows.length) * rowH + "px";
    const ctx = canvas.getContext("2d");
    ctx.scale(dpr, dpr);
    const largest = rows.reduce((m, r) => Math.max(m, r.total_bytes), 1);
    const scale = (width - labelW - 4) / largest;
    ctx.font = "11px ui-monospace, monospace";
    ctx.textBaseline = "middle";
    rows.forEach((seg, r) => {
      const y = r * rowH;
      ctx.fillStyle = "#1b1f24";
      ctx.fillText(bytes(seg.total_bytes) + " s" + seg.stream + " " + seg.pool, 2, y + rowH / 2);
      for (const b of seg.blocks) {
        const x0 = labelW + (b.address - seg.address) * scale;
        const w = Math.max(1, b.size_bytes * scale);
        ctx.fillStyle = b.state === "active_allocated" ? color(b.stack === null ? 0 : b.stack, 0.85) : STATE_COLORS[b.state] || "#8c959f";
        ctx.fillRect(x0, y + 1, w, rowH - 2);
      }
      ctx.strokeStyle = "#57606a";
      ctx.strokeRect(labelW + 0.5, y + 0.5, seg.total_bytes * scale, rowH - 1);
    });
    canvas.addEventListener("mousemove", (ev) => {
      const rect = canvas.getBoundingClientRect();
      const r = Math.floor((ev.clientY - rect.top) / rowH);
      const seg = rows[r];
      if (!seg) return;
      const addr = seg.address + (ev.clientX - rect.left - labelW) / scale;
      const b = seg.blocks.find((x) => addr >= x.address && addr < x.address + x.size_bytes);
      const lines = ["segment 0x" + seg.address.toString(16) + ": " + bytes(seg.total_bytes) + ", allocated " +
        bytes(seg.allocated_bytes) + ", stream " + seg.stream + ", pool " + seg.pool + (seg.is_expandable ? ", expandable" : "")];
      if (b) {
        lines.push("block 0x" + b.address.toString(16) + ": " + bytes(b.size_bytes) + " " + b.state +
          (b.requested_bytes !== null ? " (requested " + bytes(b.requested_bytes) + ")" : ""));
        if (b.stack !== null) lines.push(...frameText(s, b.stack));
      }
      info.textContent = lines.join("\n");
    });
    const more = s.segments.length > rows.length ? el("p", { text: (s.segments.length - rows.length) + " more segments not drawn." }) : null;
    wrap(info);
    parts.segBox.replaceChildren(...[el("h2", { text: "Segments and blocks" }), el("p", { id: "snapshot-state-head", text: head }), canvas, more, info].filter(Boolean));
    parts.segBox.hidden = false;
    root.dataset.stateEvent = s.event;
  }

  // `want`: what the address asked for (#snapshot?file=&device=&from=&to=), else nothing.
  function selectFile(i, want) {
    want = want || {};
    current.file = i;
    const f = files[i];
    const asked = f.devices.find((d) => d.device === want.device);
    current.device = asked ? asked.device : f.devices.length ? f.devices[0].device : 0;
    parts.device.replaceChildren(...f.devices.map((d) => el("option", { value: d.device, text: "device " + d.device + " (" + d.events + " events)" })));
    parts.device.value = String(current.device);
    parts.file.value = String(i);
    parts.summary.textContent = f.summary_lines.join("\n");
    parts.segBox.hidden = true;
    if (f.devices.length === 0) {
      parts.range.textContent = "This file has no trace (recorded history): only its summary is shown.";
      return;
    }
    loadTimeline(want.from, want.to);
  }

  // A whole number from the address, or undefined.
  function intParam(params, name) {
    const v = params && params.get(name);
    return v !== null && v !== undefined && /^[0-9]{1,15}$/.test(v) ? Number(v) : undefined;
  }

  function build(node) {
    parts.file = el("select", { "aria-label": "Snapshot file", onchange: (e) => selectFile(Number(e.target.value)) });
    parts.file.style.maxWidth = "100%";
    parts.device = el("select", { "aria-label": "Device", onchange: (e) => { current.device = Number(e.target.value); loadTimeline(); } });
    parts.reset = el("button", { type: "button", text: "Whole trace", onclick: () => loadTimeline() });
    parts.eventInput = el("input", { type: "number", min: "0", "aria-label": "Event index", size: "10" });
    const go = el("button", { type: "button", text: "Segments at event", onclick: () => loadState(Number(parts.eventInput.value)) });
    parts.range = el("p", { class: "status" });
    parts.chartBox = el("div", { class: "chart", role: "img", "aria-label": "Live memory over the trace: the allocations covering most of the chart as bands, the rest as other, reserved memory as a line" });
    parts.hover = el("pre", { id: "snapshot-hover", class: "hover", "aria-live": "polite", text: "Hover over the chart for an allocation's stack; drag to zoom; click for the segments at that event." });
    parts.oom = el("div", { id: "snapshot-oom", class: "detail" });
    parts.segBox = el("div", { class: "detail", hidden: true });
    parts.summary = el("pre", { class: "summary" });
    wrap(parts.hover);
    wrap(parts.summary);
    parts.hover.style.minHeight = "6em";
    node.replaceChildren(
      el("div", { class: "controls" }, [parts.file, parts.device, parts.reset, parts.eventInput, go]),
      parts.range, parts.chartBox, parts.hover, parts.oom, parts.segBox,
      el("details", { class: "detail" }, [el("summary", { text: "Summary (vramctl snapshot FILE)" }), parts.summary]),
    );
  }

  window.vramctl.registerMode("snapshot", {
    mount(node, params) {
      root = node;
      const want = { file: intParam(params, "file"), device: intParam(params, "device"), from: intParam(params, "from"), to: intParam(params, "to") };
      build(node);
      api("/api/snapshot/files").then((answer) => {
        if (!root) return;
        files = answer.files;
        if (files.length === 0) {
          node.replaceChildren(el("p", { text: "No snapshot file was given to this server (vramctl snapshot view FILE, or serve --snapshot FILE)." }));
          return;
        }
        // The file's own name in the list (the path as given in its title): a long path
        // must not widen a phone's page.
        parts.file.replaceChildren(...files.map((f, i) => el("option", { value: i, title: f.name, text: f.name.split("/").pop() + " (" + bytes(f.file_bytes) + ")" })));
        selectFile(want.file !== undefined && want.file < files.length ? want.file : 0, want);
      }).catch((e) => status("Cannot list the snapshots: " + e.message));
      resizeObserver = new ResizeObserver(() => { if (chart) chart.setSize(chartSize()); });
      resizeObserver.observe(node);
    },
    unmount() {
      if (resizeObserver) resizeObserver.disconnect();
      if (chart) chart.destroy();
      chart = null; tl = null; layout = null; root = null; resizeObserver = null;
    },
  });
})();
