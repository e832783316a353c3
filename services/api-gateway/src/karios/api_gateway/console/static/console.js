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

  function startLive(region) {
    let pending = [];
    async function refresh() {
      const r = await fetch(region.dataset.live, { credentials: "same-origin" });
      if (r.redirected || r.status === 401) { window.location = "/console/login"; return; }
      if (!r.ok) return;
      region.innerHTML = await r.text();
      applyLiveLabels(region);
      region.dispatchEvent(new CustomEvent("karios:refreshed", { bubbles: true }));
    }
    function soon() {
      // The read model follows the event stream by a moment: look now and once more later.
      pending.forEach(clearTimeout);
      pending = [setTimeout(refresh, 250), setTimeout(refresh, 1500)];
    }
    region.karios = { refresh, soon };
    const url = "/controlnode/events?channel=" + encodeURIComponent(region.dataset.channels);
    const es = new EventSource(url);
    for (const name of (region.dataset.events || "").split(",").filter(Boolean)) {
      es.addEventListener(name, (msg) => {
        if (name === "fabric_switch") {
          try {
            const ev = JSON.parse(msg.data).data || {};
            if (ev.state === "apply_started") for (const k of Object.keys(liveLabels)) delete liveLabels[k];
            if (ev.node_ip && ev.job_id) liveLabels[ev.node_ip] = ev;
            applyLiveLabels(region);
            const st = $("#action-status");
            if (st && ev.job_id) st.textContent = `${ev.state} ${ev.progress || 0}%`;
          } catch (e) { /* a malformed event changes nothing */ }
        }
        soon();
      });
    }
    setInterval(refresh, 5000); // a backstop for an event this page does not know by name
    document.body.dataset.sse = "open";
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
        $("#ack-ranges").textContent = `The switch listens on ${details.old_listen_range}; it must listen on ${details.new_listen_range}. Paste this, then confirm:`;
        const sel = $("#ack-nos");
        sel.textContent = "";
        for (const s of details.snippets) { const o = document.createElement("option"); o.textContent = s.nos; sel.append(o); }
        sel.onchange = () => show(sel.value);
        show(details.switch_nos);
        $("#ack").hidden = false;
      } else if (res.ok) { flash("configuration saved", "ok"); window.location.reload(); }
      else flash(errorText(res), "fail");
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
