// coldbrew dashboard: a job page's live updates from its event stream (same origin only).
// The page names its stream in <main id="job" data-events="...">; each `status` event
// carries the job's status JSON. When the job ends, the page reloads once to show the
// final attempts and audit entries, which the stream does not carry.
"use strict";
(function () {
  const main = document.getElementById("job");
  if (!main || !window.EventSource) return;
  const terminal = new Set(["succeeded", "failed", "dead", "cancelled"]);
  const startedTerminal = terminal.has(main.dataset.status);
  if (startedTerminal) return;
  const text = (id, value) => {
    const el = document.getElementById(id);
    if (el) el.textContent = value;
  };
  const source = new EventSource(main.dataset.events);
  source.addEventListener("status", (event) => {
    const job = JSON.parse(event.data);
    text("status", job.status);
    text("attempt", String(job.attempt));
    text("progress-message", job.progress_message || "");
    const error = job.error ? job.error.kind + ": " + (job.error.message || "") : "";
    text("error", error);
    text("status-json", JSON.stringify(job, null, 2));
    const bar = document.getElementById("progress");
    if (bar && typeof job.progress === "number") bar.value = job.progress;
    main.dataset.status = job.status;
    if (terminal.has(job.status)) {
      source.close();
      window.location.reload();
    }
  });
  source.addEventListener("error", () => {
    // the browser reconnects by itself (retry: 2000, Last-Event-ID); nothing to do here
  });
})();
