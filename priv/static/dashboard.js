// Observatory dashboard: keeps a page live (the Session Cluster Manager, the agents
// list, an agent's page): the element marked [data-live-root].
//
// - Opens the page's event stream (<body data-stream>, default /dashboard/events;
//   Server-Sent Events). The first event, "mount", carries this page's id and the
//   full HTML; "render" events carry the new HTML after each change. EventSource
//   reconnects by itself when the gateway restarts, and the new stream mounts afresh.
// - Patches the DOM in place (elements matched by id), so unchanged rows, nodes and
//   buttons are left alone: focus stays put, animations do not restart, and what an
//   operator is typing in a field stays there.
// - Sends clicks on [phx-click] elements, with their phx-value-* attributes as
//   params, and submits of form[phx-submit], with the form's fields as params, to
//   POST /dashboard/events with the page's CSRF token.
// - After Inspect (or Pause and Inspect), scrolls the Inspect panel into view when it
//   is off screen (on a phone it sits above the fleet the click came from).
//
// The HTML comes from the server, where every agent-supplied string is escaped; it
// is parsed in an inert <template> and never evaluated as script.
(() => {
  "use strict";

  const csrf = document.querySelector('meta[name="csrf-token"]')?.content || "";
  const streamUrl = document.body.dataset.stream || "/dashboard/events";
  const ROOT = "[data-live-root]";
  const statusEl = document.getElementById("live-status");
  let pageId = null;
  let source = null;
  let revealFor = null; // the session whose Inspect panel should be scrolled to

  function setStatus(state, text) {
    document.body.dataset.live = state;
    if (statusEl) {
      statusEl.dataset.state = state;
      statusEl.textContent = text;
    }
  }

  // ---- DOM patching -------------------------------------------------------------

  function morph(from, to) {
    if (from.nodeType !== to.nodeType || from.nodeName !== to.nodeName) return to;
    if (from.nodeType === Node.TEXT_NODE || from.nodeType === Node.COMMENT_NODE) {
      if (from.nodeValue !== to.nodeValue) from.nodeValue = to.nodeValue;
      return from;
    }
    if (from.nodeType !== Node.ELEMENT_NODE) return to;
    if (from.isEqualNode(to)) return from;
    for (const name of from.getAttributeNames()) {
      if (!to.hasAttribute(name)) from.removeAttribute(name);
    }
    for (const name of to.getAttributeNames()) {
      const value = to.getAttribute(name);
      if (from.getAttribute(name) !== value) from.setAttribute(name, value);
    }
    morphChildren(from, to);
    return from;
  }

  function morphChildren(from, to) {
    const olds = Array.from(from.childNodes);
    const byId = new Map();
    for (const node of olds) if (node.nodeType === Node.ELEMENT_NODE && node.id) byId.set(node.id, node);
    const used = new Set();
    const result = [];
    let cursor = 0;

    for (const next of Array.from(to.childNodes)) {
      let match = null;
      if (next.nodeType === Node.ELEMENT_NODE && next.id) {
        match = byId.get(next.id) || null;
      } else {
        while (cursor < olds.length && (used.has(olds[cursor]) || olds[cursor].id)) cursor++;
        if (cursor < olds.length && olds[cursor].nodeName === next.nodeName) match = olds[cursor++];
      }
      if (match && !used.has(match)) {
        used.add(match);
        result.push(morph(match, next));
      } else {
        result.push(next);
      }
    }

    for (const node of olds) if (!result.includes(node)) node.remove();
    result.forEach((node, i) => {
      if (from.childNodes[i] !== node) from.insertBefore(node, from.childNodes[i] || null);
    });
  }

  function apply(html) {
    const current = document.querySelector(ROOT);
    const template = document.createElement("template");
    template.innerHTML = html;
    const next = template.content.firstElementChild;
    if (!current || !next) return;
    const kept = morph(current, next);
    if (kept !== current) current.replaceWith(kept);
    document.body.dataset.renders = String(Number(document.body.dataset.renders || 0) + 1);
    reveal();
  }

  function reveal() {
    const panel = document.getElementById("inspector");
    if (!revealFor || !panel || panel.dataset.sessionId !== revealFor) return;
    revealFor = null;
    const top = panel.getBoundingClientRect().top;
    if (top < 0 || top > window.innerHeight * 0.6) panel.scrollIntoView({ block: "start" });
  }

  // ---- Event stream ---------------------------------------------------------------

  function connect() {
    source = new EventSource(streamUrl);
    source.addEventListener("mount", (e) => {
      const data = JSON.parse(e.data);
      pageId = data.page_id;
      document.body.dataset.pageId = pageId;
      apply(data.html);
      setStatus("live", "Live");
    });
    source.addEventListener("render", (e) => apply(JSON.parse(e.data).html));
    source.addEventListener("error", () => {
      pageId = null;
      setStatus("reconnecting", "Reconnecting…");
      // CONNECTING: the browser retries by itself. CLOSED: the server refused the
      // stream (signed out, or a new secret after a restart): find out which.
      if (source.readyState === EventSource.CLOSED) setTimeout(recover, 1000);
    });
  }

  async function recover() {
    try {
      const res = await fetch("/", { redirect: "manual", credentials: "same-origin" });
      if (res.type === "opaqueredirect" || res.status === 401) {
        location.assign("/login");
        return;
      }
      connect();
    } catch (_networkError) {
      setTimeout(recover, 1000);
    }
  }

  // ---- Clicks -------------------------------------------------------------------

  function showNotice(text) {
    const el = document.querySelector(`${ROOT} .notice`);
    if (!el) return;
    el.className = "notice notice-error";
    el.textContent = text;
  }

  async function push(event, params, el) {
    if (!pageId) {
      showNotice("Not connected yet: try again in a moment.");
      return;
    }
    el.disabled = true;
    try {
      const res = await fetch("/dashboard/events", {
        method: "POST",
        credentials: "same-origin",
        headers: { "content-type": "application/json", "x-csrf-token": csrf },
        body: JSON.stringify({ page_id: pageId, event, params }),
      });
      if (res.status === 401) location.assign("/login");
      else if (!res.ok) showNotice(`The action failed (HTTP ${res.status}).`);
      else reveal();
    } catch (_networkError) {
      showNotice("The gateway did not answer: the action may not have been applied.");
    } finally {
      el.disabled = false;
    }
  }

  document.addEventListener("click", (e) => {
    const el = e.target.closest("[phx-click]");
    if (!el || !el.closest(ROOT)) return;
    e.preventDefault();
    const params = {};
    for (const name of el.getAttributeNames()) {
      if (name.startsWith("phx-value-")) params[name.slice("phx-value-".length)] = el.getAttribute(name);
    }
    const event = el.getAttribute("phx-click");
    if (event === "inspect" || event === "pause_inspect") revealFor = params.session_id;
    push(event, params, el);
  });

  document.addEventListener("submit", (e) => {
    const form = e.target.closest("form[phx-submit]");
    if (!form || !form.closest(ROOT)) return;
    e.preventDefault();
    const params = {};
    for (const [name, value] of new FormData(form)) if (typeof value === "string") params[name] = value;
    push(form.getAttribute("phx-submit"), params, e.submitter || form);
  });

  connect();
})();
