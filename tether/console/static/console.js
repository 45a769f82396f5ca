// Tether console: confirmations before actions, and live refresh of the parts marked data-live.
// No framework and no build step; every value shown is text from the server, never parsed HTML
// from run data (partials are rendered and escaped by the server).
"use strict";

document.addEventListener("submit", (event) => {
  const button = event.submitter;
  const message = (button && button.dataset.confirm) || event.target.dataset.confirm;
  if (message && !window.confirm(message)) {
    event.preventDefault();
  }
});

function busy(element) {
  // Do not replace a form someone is filling in.
  const active = document.activeElement;
  return active && element.contains(active) && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName) && active.value;
}

async function refresh(element) {
  if (busy(element)) return;
  const url = new URL(element.dataset.live, window.location.href);
  url.searchParams.set("partial", "1");
  const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } });
  if (response.ok && response.headers.get("content-type").startsWith("text/html")) {
    element.innerHTML = await response.text();
    element.dispatchEvent(new CustomEvent("tether:refreshed", { bubbles: true }));
  }
}

function pollRevision(elements) {
  let revision = null;
  const tick = async () => {
    try {
      const response = await fetch("/api/v1/runs/revision", { credentials: "same-origin" });
      if (response.ok) {
        const body = await response.json();
        if (revision !== null && body.revision !== revision) {
          await Promise.all(elements.map(refresh));
        }
        revision = body.revision;
      }
    } catch (error) {
      // The console may be restarting; try again on the next tick.
    }
    window.setTimeout(tick, 2000);
  };
  tick();
}

function follow(element) {
  const timeline = document.getElementById("timeline");
  const url = new URL(element.dataset.stream, window.location.href);
  url.searchParams.set("after", element.dataset.after || "0");
  const source = new EventSource(url);
  let pending = null;
  source.onmessage = (message) => {
    const event = JSON.parse(message.data);
    if (timeline) {
      const item = document.createElement("li");
      item.dataset.seq = String(event.seq);
      const time = document.createElement("time");
      time.dateTime = event.recorded_at;
      time.textContent = event.recorded_at.slice(0, 19).replace("T", " ");
      const type = document.createElement("strong");
      type.textContent = event.type;
      item.append(time, " ", type);
      if (event.payload && event.payload.nodeId) {
        const node = document.createElement("span");
        node.className = "muted";
        node.textContent = " " + event.payload.nodeId;
        item.append(node);
      }
      timeline.append(item);
    }
    window.clearTimeout(pending);
    pending = window.setTimeout(() => refresh(element), 100);
  };
}

document.addEventListener("DOMContentLoaded", () => {
  const live = Array.from(document.querySelectorAll("[data-live]"));
  const streamed = live.filter((element) => element.dataset.stream);
  streamed.forEach(follow);
  const polled = live.filter((element) => !element.dataset.stream);
  if (polled.length) pollRevision(polled);
});
