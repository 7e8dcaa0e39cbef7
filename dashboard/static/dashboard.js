// rocketraft dashboard: refreshes the page's sections from its JSON twin every poll interval, and posts the change
// forms (JSON) showing the server's answer. No framework, no build step.
(function () {
  "use strict";
  const api = document.body.dataset.api;
  const pollMs = Number(document.body.dataset.pollMs || 0);
  const errorBox = document.getElementById("error");
  const flashBox = document.getElementById("flash");
  const updated = document.getElementById("updated");

  function show(box, text, kind) {
    box.textContent = text || "";
    box.hidden = !text;
    if (kind) box.className = "notice " + kind;
  }

  async function refresh() {
    let answer;
    try {
      const response = await fetch(api + location.search, {headers: {Accept: "application/json"}});
      answer = await response.json();
    } catch (e) {
      show(errorBox, "The dashboard server does not answer (" + e.message + "): is it still running?");
      return;
    }
    for (const [id, html] of Object.entries(answer.sections || {})) {
      const section = document.getElementById(id);
      if (section && section.innerHTML !== html) section.innerHTML = html;
    }
    show(errorBox, answer.error);
    updated.textContent = "updated " + new Date(answer.updated_ms).toLocaleTimeString();
  }

  document.addEventListener("submit", async function (event) {
    const form = event.target;
    if (!form.dataset.action) return;  // plain GET forms (the message query) submit normally
    event.preventDefault();
    if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) return;
    const fields = Object.fromEntries(new FormData(form).entries());
    let answer;
    try {
      const response = await fetch(form.dataset.action, {method: "POST", body: JSON.stringify(fields),
        headers: {"Content-Type": "application/json"}});
      answer = await response.json();
    } catch (e) {
      answer = {ok: false, message: "no answer from the dashboard server (" + e.message + ")"};
    }
    show(flashBox, answer.message, answer.ok ? "ok" : "error");
    if (answer.ok && pollMs > 0) refresh();
  });

  if (pollMs > 0) {
    updated.textContent = "live";
    setInterval(refresh, pollMs);
  }
})();
