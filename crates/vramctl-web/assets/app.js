// The page's shell: the mode switch (tabs), and helpers every mode uses.
// Modes register with vramctl.registerMode(name, {mount(root, params), unmount()}); the
// shell mounts the one named in the address (#live, #fleet, ...) into its panel, with the
// address's parameters after "?" (#live?from=…&to=…: a link to a zoomed view).
// Text from the server is data: it goes into textContent, never innerHTML.
"use strict";
(function () {
  const modes = new Map();
  let current = null;

  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    if (attrs) {
      for (const [key, value] of Object.entries(attrs)) {
        if (value === null || value === undefined || value === false) continue;
        if (key === "text") node.textContent = String(value);
        else if (key === "class") node.className = value;
        else if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
        else node.setAttribute(key, value === true ? "" : String(value));
      }
    }
    for (const child of [].concat(children || [])) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];
  function bytes(n) {
    if (n === null || n === undefined) return "—";
    let v = Number(n), u = 0;
    while (Math.abs(v) >= 1024 && u < UNITS.length - 1) { v /= 1024; u++; }
    return (u === 0 ? v.toFixed(0) : v.toFixed(v < 10 ? 2 : v < 100 ? 1 : 0)) + " " + UNITS[u];
  }

  async function api(path) {
    const response = await fetch(path, { headers: { Accept: "application/json" }, credentials: "same-origin" });
    let body = null;
    try { body = await response.json(); } catch (e) { body = null; }
    if (!response.ok) throw new Error((body && body.error) || (response.status + " " + response.statusText));
    return body;
  }

  function status(text) {
    const node = document.getElementById("status");
    if (node) node.textContent = text || "";
  }

  function tabs() { return Array.from(document.querySelectorAll("#modes [role=tab]")); }

  function parseHash() {
    const hash = location.hash.slice(1);
    const cut = hash.indexOf("?");
    return cut < 0 ? [hash, ""] : [hash.slice(0, cut), hash.slice(cut + 1)];
  }

  function show(name, query) {
    query = query || "";
    if (!modes.has(name)) { name = tabs().map((t) => t.dataset.mode).find((m) => modes.has(m)); query = ""; }
    if (!name || (current && current.name === name && current.query === query)) return;
    if (current) {
      try { current.mode.unmount(); } catch (e) { console.error(e); }
      current.root.replaceChildren();
      current.root.hidden = true;
    }
    for (const tab of tabs()) {
      const selected = tab.dataset.mode === name;
      tab.setAttribute("aria-selected", String(selected));
      tab.tabIndex = selected ? 0 : -1;
    }
    const root = document.getElementById("panel-" + name);
    root.hidden = false;
    current = { name, mode: modes.get(name), root, query };
    current.mode.mount(root, new URLSearchParams(query));
    if (parseHash()[0] !== name) history.replaceState(null, "", "#" + name);
  }

  function registerMode(name, mode) {
    modes.set(name, mode);
  }

  // A mode saying where it is (its zoom) in the address, without a reload or a remount.
  function setParams(name, params) {
    const query = params ? new URLSearchParams(params).toString() : "";
    if (current && current.name === name) current.query = query;
    history.replaceState(null, "", "#" + name + (query ? "?" + query : ""));
  }

  function start() {
    const list = tabs();
    list.forEach((tab, i) => {
      tab.addEventListener("click", () => show(tab.dataset.mode));
      tab.addEventListener("keydown", (event) => {
        let next = null;
        if (event.key === "ArrowRight") next = list[(i + 1) % list.length];
        else if (event.key === "ArrowLeft") next = list[(i - 1 + list.length) % list.length];
        else if (event.key === "Home") next = list[0];
        else if (event.key === "End") next = list[list.length - 1];
        if (next) { event.preventDefault(); next.focus(); show(next.dataset.mode); }
      });
    });
    window.addEventListener("hashchange", () => show(...parseHash()));
    show(...parseHash());
  }

  window.vramctl = { registerMode, setParams, el, bytes, api, status };
  // Mode scripts load after this one (defer keeps order); start once all have run.
  document.addEventListener("DOMContentLoaded", start);
})();
