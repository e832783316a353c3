// Karios console: keeps server-rendered regions live from SSE and sends writes to the REST API.
// No build step, no library. The cookie travels by itself (same origin); every write carries
// X-Karios-Console: 1, without which the gateway refuses the cookie.
"use strict";
(function () {
  const WRITE = { "X-Karios-Console": "1" };
  const $ = (sel, root) => (root || document).querySelector(sel);

  async function api(method, url, body) {
    const init = { method, credentials: "same-origin", headers: { ...WRITE } };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const r = await fetch(url, init);
    const text = await r.text();
    let data = null;
    try { data = JSON.parse(text); } catch (e) { data = text; }
    return { ok: r.ok, status: r.status, data };
  }

  function flash(text, kind) {
    const el = $("#flash");
    if (!el) return;
    el.textContent = text;
    el.className = "flash " + (kind || "");
    el.hidden = false;
  }

  // One short line for screen readers (the page's aria-live status region).
  function announce(text) {
    const el = $("#announce");
    if (el && text && el.textContent !== text) el.textContent = text;
  }

  // A 422 names its field(s): the message goes next to the field, the field is marked invalid.
  function showFieldErrors(form, res) {
    form.querySelectorAll("[data-error-for]").forEach((el) => { el.textContent = ""; });
    form.querySelectorAll("[aria-invalid]").forEach((el) => el.removeAttribute("aria-invalid"));
    if (res.status !== 422 || !res.data || typeof res.data !== "object") return false;
    const errs = Array.isArray(res.data.errors) && res.data.errors.length ? res.data.errors
      : [{ field: res.data.field || "", message: res.data.message || "" }];
    let shown = false;
    for (const e of errs) {
      const name = String(e.field || "").split(".")[0];
      const slot = name && form.querySelector(`[data-error-for="${CSS.escape(name)}"]`);
      if (!slot) continue;
      const text = String(e.message || "");
      slot.textContent = text.startsWith(name + ":") ? text.slice(name.length + 1).trim() : text;
      const input = form.querySelector(`[name="${CSS.escape(name)}"]`);
      if (input) { input.setAttribute("aria-invalid", "true"); if (!shown) input.focus(); }
      shown = true;
    }
    return shown;
  }

  function errorText(res) {
    const d = res.data || {};
    if (typeof d === "object" && d.message) return `${res.status} ${d.code || ""}: ${d.message}`;
    return `${res.status}: ${typeof d === "string" ? d.slice(0, 200) : "request failed"}`;
  }

  // -- live regions ----------------------------------------------------------------------
  const liveLabels = {}; // fabric node ip -> last per-node rollout event (during an apply)

  function applyLiveLabels(root) {
    for (const [ip, ev] of Object.entries(liveLabels)) {
      const g = root.querySelector(`g.node[data-node-ip="${CSS.escape(ip)}"]`);
      if (!g) continue;
      const t = g.querySelector("text.live");
      if (t) t.textContent = ev.state.replace(/^node_/, "") + (ev.message ? ": " + ev.message : "");
      if (/^node_(connecting|committing|verifying|applying)/.test(ev.state)) g.classList.add("st-applying");
    }
  }

  // The job page tells a screen reader each change of state (and the installer's stage).
  function jobSummary(root) {
    const st = root.querySelector("#job-state");
    if (!st) return "";
    const cur = root.querySelector("#timeline li.current b");
    const pct = root.querySelector("#live progress");
    return `Job ${st.dataset.state}` + (cur ? `, stage ${cur.textContent}` : "") + (pct ? `, ${pct.value}%` : "");
  }

  function startLive(region) {
    let pending = [];
    let shown = null; // the region's HTML as last fetched
    async function refresh() {
      // Never wipe a secret being typed (the retry form asks for the request's passwords again).
      if (Array.from(region.querySelectorAll("input[type=password]")).some((i) => i.value)) return;
      const before = region.dataset.announce === "job" ? jobSummary(region) : "";
      region.setAttribute("aria-busy", "true");
      const r = await fetch(region.dataset.live, { credentials: "same-origin" });
      region.removeAttribute("aria-busy");
      if (r.redirected || r.status === 401) {
        window.location = "/console/login?next=" + encodeURIComponent(location.pathname + location.search);
        return;
      }
      if (!r.ok) return;
      const html = await r.text();
      // Unchanged (the 5 s backstop, an event that moved nothing here): the DOM stays as it is,
      // so a focused control (Cancel, Retry) keeps the keyboard's focus and a click in flight
      // lands on the element it aimed at.
      if (html === shown) return;
      shown = html;
      const focused = region.contains(document.activeElement) ? document.activeElement.id : "";
      region.innerHTML = html;
      if (focused) region.querySelector("#" + CSS.escape(focused))?.focus(); // the same control, re-rendered
      applyLiveLabels(region);
      if (region.dataset.announce === "job") {
        const after = jobSummary(region);
        if (after !== before) announce(after);
      }
      region.dispatchEvent(new CustomEvent("karios:refreshed", { bubbles: true }));
    }
    function soon() {
      // The read model follows the event stream by a moment: look now and once more later.
      pending.forEach(clearTimeout);
      pending = [setTimeout(refresh, 250), setTimeout(refresh, 1500)];
    }
    region.karios = { refresh, soon };
    const url = "/controlnode/events?channel=" + encodeURIComponent(region.dataset.channels);
    const names = (region.dataset.events || "").split(",").filter(Boolean);
    function onEvent(name, msg) {
      if (name === "fabric_switch") {
        try {
          const ev = JSON.parse(msg.data).data || {};
          if (ev.state === "apply_started") for (const k of Object.keys(liveLabels)) delete liveLabels[k];
          if (ev.node_ip && ev.job_id) liveLabels[ev.node_ip] = ev;
          applyLiveLabels(region);
          const st = $("#action-status");
          if (st && ev.job_id) st.textContent = `${ev.state} ${ev.progress || 0}%`;
        } catch (e) { /* a malformed event changes nothing */ }
      } else if (region.dataset.announce === "jobs") {
        try {
          const ev = JSON.parse(msg.data).data || {};
          if (ev.bmc_ip && ev.state) announce(`${ev.bmc_ip}: ${ev.state}${ev.percent ? " " + ev.percent + "%" : ""}`);
        } catch (e) { /* a malformed event changes nothing */ }
      }
      soon();
    }
    let es = null;
    function listen() {
      es = new EventSource(url);
      for (const name of names) es.addEventListener(name, (msg) => onEvent(name, msg));
      document.body.dataset.sse = "open";
    }
    // A page left for another stays in the browser's back/forward cache with its stream open:
    // HTTP/1.1 allows six connections to the gateway, so after a few pages the next one waited
    // (a minute in Chromium) for a connection. The stream is closed when the page is hidden and
    // opened again, with a look at what changed meanwhile, when it is shown from that cache.
    window.addEventListener("pagehide", () => {
      if (es) es.close();
      es = null;
      document.body.dataset.sse = "closed";
    });
    window.addEventListener("pageshow", (e) => {
      if (e.persisted && !es) { listen(); refresh(); }
    });
    listen();
    setInterval(refresh, 5000); // a backstop for an event this page does not know by name
  }

  // -- actions ---------------------------------------------------------------------------
  function formBody(form) {
    const body = {};
    for (const [k, v] of new FormData(form).entries()) if (String(v).trim() !== "") body[k] = String(v).trim();
    return body;
  }

  document.addEventListener("click", async (e) => {
    const cancel = e.target.closest("[data-cancel]");
    if (cancel) {
      cancel.disabled = true;
      const res = await api("POST", `/controlnode/job/${encodeURIComponent(cancel.dataset.cancel)}/cancel`);
      flash(res.ok ? `cancel requested: ${res.data.state || ""} ${res.data.message || ""}` : errorText(res), res.ok ? "ok" : "fail");
      const live = $("#live");
      if (live && live.karios) live.karios.soon();
    }
  });

  // Retry: the ended job's request again, through the same API call as the provision form.
  document.addEventListener("submit", async (e) => {
    const form = e.target.closest("#retry-form");
    if (!form) return;
    e.preventDefault();
    const body = { ...JSON.parse(form.dataset.retry), ...formBody(form) };
    const button = form.querySelector("button");
    button.disabled = true;
    const res = await api("POST", "/controlnode/provision", body);
    if (res.ok) { window.location = "/console/jobs/" + encodeURIComponent(res.data.job_id); return; }
    button.disabled = false;
    flash(errorText(res), "fail");
  });

  // Adopt a discovered server (POST /controlnode/discovered/{id}/adopt).
  document.addEventListener("submit", async (e) => {
    const form = e.target.closest("form[data-adopt]");
    if (!form) return;
    e.preventDefault();
    const res = await api("POST", `/controlnode/discovered/${encodeURIComponent(form.dataset.adopt)}/adopt`, formBody(form));
    if (res.ok) {
      flash(`adopted as ${res.data.server.hostname}`, "ok");
      setTimeout(() => window.location.reload(), 800);
    } else if (!showFieldErrors(form, res)) flash(errorText(res), "fail");
  });

  function bindProvision() {
    const form = $("#provision-form");
    if (!form) return;
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      const res = await api("POST", "/controlnode/provision", formBody(form));
      if (res.ok) window.location = "/console/jobs/" + encodeURIComponent(res.data.job_id);
      else flash(errorText(res), "fail");
    });
  }

  function bindFabric() {
    const pf = $("#preflight-form");
    if (pf) pf.addEventListener("submit", async (e) => {
      e.preventDefault();
      $("#action-status").textContent = "preflight running…";
      const r = await fetch("/console/fabric/preflight", {
        method: "POST", credentials: "same-origin",
        headers: { ...WRITE, "Content-Type": "application/json" }, body: JSON.stringify(formBody(pf)),
      });
      const html = await r.text();
      $("#action-status").textContent = r.ok ? "preflight done" : "";
      if (r.ok) { $("#live").innerHTML = html; applyLiveLabels($("#live")); } else flash(`${r.status}: ${html.replace(/<[^>]+>/g, "")}`, "fail");
    });
    const apply = $("#apply");
    if (apply) apply.addEventListener("click", async () => {
      const res = await api("POST", "/controlnode/fabric-config/apply");
      flash(res.ok ? `apply ${res.data.apply_job_id} started` : errorText(res), res.ok ? "ok" : "fail");
      $("#live").karios.soon();
    });
    const diff = $("#load-diff");
    if (diff) diff.addEventListener("click", async () => {
      const out = $("#diff-out");
      out.textContent = "diffing every node…";
      const r = await fetch("/console/fabric/diff", { method: "POST", credentials: "same-origin", headers: WRITE });
      out.innerHTML = await r.text();
    });
    bindAck();
    const create = $("#fabric-create-form");
    if (create) create.addEventListener("submit", async (e) => {
      e.preventDefault();
      const res = await api("POST", "/controlnode/fabric-config", formBody(create));
      if (res.ok) { flash("configuration created", "ok"); setTimeout(() => window.location.reload(), 800); return; }
      const near = showFieldErrors(create, res);
      flash(near ? "fix the field marked below" : errorText(res), "fail");
    });
  }

  function bindAck() {
    const form = $("#config-form");
    if (!form) return;
    let body = null, details = null;
    const show = (nos) => {
      const s = details.snippets.find((x) => x.nos === nos) || details.snippets[0];
      $("#ack-snippet").textContent = s.snippet;
      $("#ack-verify").textContent = s.verify || "";
      $("#ack-hash").textContent = s.switch_snippet_hash;
      $("#ack-nos").value = s.nos;
    };
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      body = formBody(form);
      const res = await api("POST", "/controlnode/fabric-config", body);
      if (res.status === 409 && res.data && res.data.code === "REQUIRES_SWITCH_RECONFIG_ACK") {
        details = res.data.details;
        const [was, will] = [details.old_listen_range, details.new_listen_range];
        const moves = was && will && was !== will ? ` Its BGP listen range moves from ${was} to ${will}.`
          : was !== will ? ` The switch ${was ? "stops" : "starts"} running BGP.` : "";
        $("#ack-ranges").textContent = `This change reconfigures the fabric switch (${(details.changed_fields || []).join(", ")}).${moves} Paste this on the switch, then confirm:`;
        const sel = $("#ack-nos");
        sel.textContent = "";
        for (const s of details.snippets) { const o = document.createElement("option"); o.textContent = s.nos; sel.append(o); }
        sel.onchange = () => show(sel.value);
        show(details.switch_nos);
        $("#ack").hidden = false;
      } else if (res.ok) { flash("configuration saved", "ok"); window.location.reload(); }
      else { showFieldErrors(form, res); flash(errorText(res), "fail"); }
    });
    $("#ack-confirm").addEventListener("click", async () => {
      const nos = $("#ack-nos").value;
      const res = await api("POST", "/controlnode/fabric-config", {
        ...body, switch_acked: true, switch_nos: nos, switch_snippet_hash: $("#ack-hash").textContent,
        acked_by: $("#ack-by").value.trim(),
      });
      if (res.ok) { flash(`configuration saved; switch change acknowledged (${nos})`, "ok"); $("#ack").hidden = true; setTimeout(() => window.location.reload(), 800); }
      else flash(errorText(res), "fail");
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    document.querySelectorAll("section[data-live]").forEach(startLive);
    bindProvision();
    bindFabric();
  });
})();
