// The fleet mode (serve --prometheus URL): hosts × GPUs, the biggest holders and the
// leak/idle verdicts across hosts, read by the server from Prometheus (/api/fleet), and one
// host's drill-down (/api/fleet/host): its GPUs' used memory over the last hour, its
// processes, a link to its own vramctl page when its instance label is host:port.
// Every label comes from a scrape target, so it is hostile: it goes into textContent,
// with control and bidi characters shown escaped (as vramctl's terminal output does).
"use strict";
(function () {
  const { el, bytes, api, status } = window.vramctl;
  const REFRESH_MS = 10000;
  let root = null;
  let timer = null;
  let chart = null;
  let selected = null; // {job, instance}

  // The characters vramctl_core::untrusted escapes: C0, DEL, C1, bidi marks, embeddings,
  // overrides and isolates, line and paragraph separators.
  const UNSAFE = /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]/g;
  function shown(text) {
    if (text === null || text === undefined || text === "") return "—";
    return String(text).replace(UNSAFE, (c) => {
      if (c === "\t") return "\\t";
      if (c === "\n") return "\\n";
      if (c === "\r") return "\\r";
      return "\\u{" + c.charCodeAt(0).toString(16) + "}";
    });
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "—";
    const s = Math.round(seconds);
    if (s < 120) return s + " s";
    if (s < 7200) return Math.round(s / 60) + " min";
    return (s / 3600).toFixed(1) + " h";
  }

  function hostLabel(h) {
    return shown(h.instance) + (h.job && h.job !== "vramctl" ? " (" + shown(h.job) + ")" : "");
  }

  function sameHost(a, b) {
    return a && b && a.job === b.job && a.instance === b.instance;
  }

  // A link to the host's own vramctl page, with this page's scheme; only for an address
  // the server checked is host:port.
  function ownPage(address) {
    if (!address) return null;
    return el("a", { href: location.protocol + "//" + address + "/", rel: "noreferrer" }, "its own page");
  }

  function gpuCell(gpu) {
    const used = gpu.used_bytes, total = gpu.total_bytes;
    const label = "GPU " + shown(gpu.gpu) + (gpu.name ? " · " + shown(gpu.name) : "");
    const parts = [el("span", { class: "gpu-name", text: label })];
    if (used !== null && total) {
      parts.push(el("meter", { min: 0, max: total, value: used, "aria-label": label + " memory used" }));
    }
    parts.push(el("span", { class: "num", text: bytes(used) + " / " + bytes(total) + (gpu.up === false ? " · down" : "") }));
    return el("li", { class: "fleet-gpu", "data-uuid": gpu.uuid }, parts);
  }

  function hostsTable(fleet) {
    const rows = fleet.hosts.map((h) =>
      el("tr", { class: sameHost(h, selected) ? "selected" : null, "data-instance": h.instance }, [
        el("th", { scope: "row" }, el("button", {
          class: "link", type: "button", text: hostLabel(h),
          onclick: () => { selected = { job: h.job, instance: h.instance }; drill(); },
        })),
        el("td", { class: h.up === false ? "verdict-leak" : null, text: h.up === null ? "—" : h.up ? "up" : "down" }),
        el("td", { class: "num", text: bytes(h.used_bytes) + " / " + bytes(h.total_bytes) }),
        el("td", null, el("ul", { class: "fleet-gpus" }, h.gpus.map(gpuCell))),
        el("td", { class: "num", text: h.sample_age_seconds === null ? "—" : h.sample_age_seconds.toFixed(1) + " s" }),
      ]));
    return el("table", { class: "procs", id: "fleet-hosts" }, [
      el("caption", { text: "Hosts (" + fleet.hosts.length + ")" }),
      el("thead", null, el("tr", null, ["Host", "Scrape", "Memory used", "GPUs", "Sample age"].map((t) => el("th", { scope: "col", text: t })))),
      el("tbody", null, rows),
    ]);
  }

  function holderCells(p, withHost) {
    return [
      withHost ? el("td", { text: hostLabel(p) }) : null,
      el("td", { class: "num", text: shown(p.gpu) }),
      el("td", { class: "num", text: shown(p.pid) }),
      el("td", { class: "wide", text: shown(p.user) }),
      el("td", { class: "cmd", text: shown(p.command) }),
      el("td", { class: "num", text: bytes(p.used_bytes) }),
    ];
  }

  function holdersTable(holders, caption, id, withHost) {
    const head = (withHost ? ["Host"] : []).concat(["GPU", "PID", "User", "Command", "Memory"]);
    return el("table", { class: "procs", id }, [
      el("caption", { text: caption }),
      el("thead", null, el("tr", null, head.map((t) => el("th", { scope: "col", class: t === "User" ? "wide" : null, text: t })))),
      el("tbody", null, holders.map((p) => el("tr", null, holderCells(p, withHost)))),
    ]);
  }

  function verdictsTable(verdicts, id, withHost) {
    const head = ["Verdict"].concat(withHost ? ["Host"] : [], ["GPU", "PID", "User", "Command", "Memory", "Why"]);
    const rows = verdicts.map((v) => {
      const leak = v.kind === "leak";
      const why = leak
        ? "grows " + bytes(v.leak_slope_bytes_per_second) + "/s"
        : "idle for " + duration(v.idle_seconds);
      return el("tr", null, [el("td", { class: leak ? "verdict-leak" : "verdict-idle", text: leak ? "leak" : "idle" })]
        .concat(holderCells(v, withHost), [el("td", { text: why })]));
    });
    return el("table", { class: "procs", id }, [
      el("caption", { text: "Leak and idle verdicts (" + verdicts.length + ")" }),
      el("thead", null, el("tr", null, head.map((t) => el("th", { scope: "col", class: t === "User" ? "wide" : null, text: t })))),
      el("tbody", null, rows.length ? rows : [el("tr", null, el("td", { colspan: head.length, text: "None now." }))]),
    ]);
  }

  function drawCurves(node, detail) {
    if (chart) { chart.destroy(); chart = null; }
    if (!window.uPlot || !detail.curves.length) return;
    const times = detail.curves[0].times_unix_s;
    const data = [times].concat(detail.curves.map((c) => {
      const byTime = new Map(c.times_unix_s.map((t, i) => [t, c.used_bytes[i]]));
      return times.map((t) => (byTime.has(t) ? byTime.get(t) : null));
    }));
    const series = [{}].concat(detail.curves.map((c) => ({
      label: "GPU " + shown(c.gpu), value: (u, v) => bytes(v),
    })));
    const width = Math.max(320, Math.min(node.clientWidth || 900, 1200));
    chart = new window.uPlot({
      width, height: 240, series,
      axes: [{}, { values: (u, ticks) => ticks.map((v) => bytes(v)), size: 80 }],
    }, data, node);
  }

  async function drill() {
    if (!root || !selected) return;
    const section = root.querySelector("#fleet-detail");
    if (!section) return;
    const key = selected;
    const query = "job=" + encodeURIComponent(key.job) + "&instance=" + encodeURIComponent(key.instance) + "&window=3600";
    section.replaceChildren(el("h2", { text: "Host " + hostLabel(key) }), el("p", { class: "status", text: "Loading…" }));
    section.hidden = false;
    for (const row of root.querySelectorAll("#fleet-hosts tbody tr")) {
      row.classList.toggle("selected", row.dataset.instance === key.instance);
    }
    let detail;
    try {
      detail = await api("/api/fleet/host?" + query);
    } catch (e) {
      section.replaceChildren(el("h2", { text: "Host " + hostLabel(key) }), el("p", { class: "status", text: "Prometheus: " + shown(e.message) }));
      return;
    }
    if (!sameHost(key, selected) || !root) return;
    const host = detail.host;
    const link = host ? ownPage(host.address) : null;
    const chartNode = el("div", { class: "chart", role: "img", "aria-label": "Used memory per GPU over the last hour" });
    section.replaceChildren(
      el("h2", { text: "Host " + hostLabel(key) }),
      el("p", { class: "now" }, [
        host ? bytes(host.used_bytes) + " of " + bytes(host.total_bytes) + " used on " + host.gpus.length + " GPU(s)" : "No vramctl series for this host now.",
        link ? " · " : null, link,
      ]),
      el("h3", { text: "Used memory per GPU, last hour (step " + detail.step_seconds + " s)" }),
      chartNode,
      el("div", { class: "tablewrap" }, holdersTable(detail.processes, "Processes (" + detail.processes.length + ")", "fleet-host-processes", false)),
      el("div", { class: "tablewrap" }, verdictsTable(detail.verdicts, "fleet-host-verdicts", false)),
    );
    drawCurves(chartNode, detail);
  }

  async function refresh() {
    if (!root) return;
    let fleet;
    try {
      fleet = await api("/api/fleet");
    } catch (e) {
      status("Fleet: " + shown(e.message));
      return;
    }
    if (!root) return;
    status("Fleet from Prometheus at " + shown(fleet.prometheus) + ", " + new Date(fleet.queried_at_ms).toLocaleTimeString());
    const detail = root.querySelector("#fleet-detail") || el("section", { id: "fleet-detail", class: "detail", hidden: true, "aria-live": "polite" });
    root.replaceChildren(
      el("div", { class: "tablewrap" }, hostsTable(fleet)),
      el("div", { class: "tablewrap" }, verdictsTable(fleet.verdicts, "fleet-verdicts", true)),
      el("div", { class: "tablewrap" }, holdersTable(fleet.holders, "Biggest holders across hosts", "fleet-holders", true)),
      detail,
    );
  }

  window.vramctl.registerMode("fleet", {
    mount(node) {
      root = node;
      // A drill-down can be linked: /?job=JOB&instance=INSTANCE#fleet opens that host.
      const params = new URLSearchParams(location.search);
      if (params.get("job") && params.get("instance")) {
        selected = { job: params.get("job"), instance: params.get("instance") };
      }
      refresh().then(() => { if (selected) drill(); });
      timer = setInterval(refresh, REFRESH_MS);
    },
    unmount() {
      if (timer) clearInterval(timer);
      if (chart) chart.destroy();
      timer = null;
      chart = null;
      root = null;
    },
  });
})();
