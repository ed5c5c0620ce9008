// rqsys web UI: the live tail of a message's job/stdio.log, with ANSI colours.
// Plain JS, no build step. Polls tail.json?offset=N until the message ends.
"use strict";

const SGR_RE = /\x1b\[([0-9;]*)m/g;
const CONTROL_RE = /\x1b\[[0-9;?]*[A-Za-z]/g;

function applySgr(style, codes) {
  for (const code of codes.length ? codes : [0]) {
    if (code === 0) { style.fg = null; style.bg = null; style.bold = false; }
    else if (code === 1) style.bold = true;
    else if (code === 22) style.bold = false;
    else if (code >= 30 && code <= 37) style.fg = code;
    else if (code >= 90 && code <= 97) style.fg = code - 60;
    else if (code === 39) style.fg = null;
    else if (code >= 40 && code <= 47) style.bg = code;
    else if (code === 49) style.bg = null;
  }
}

function spanFor(text, style) {
  const span = document.createElement("span");
  span.textContent = text.replace(CONTROL_RE, "");  // textContent: never parsed as HTML
  const classes = [];
  if (style.fg) classes.push("ansi-" + style.fg);
  if (style.bg) classes.push("ansi-bg-" + style.bg);
  if (style.bold) classes.push("ansi-bold");
  if (classes.length) span.className = classes.join(" ");
  return span;
}

function renderAnsi(target, text, style) {
  let last = 0;
  for (const match of text.matchAll(SGR_RE)) {
    if (match.index > last) target.appendChild(spanFor(text.slice(last, match.index), style));
    applySgr(style, match[1].split(";").filter((s) => s !== "").map(Number));
    last = match.index + match[0].length;
  }
  if (last < text.length) target.appendChild(spanFor(text.slice(last), style));
}

function offerReload(stateEl) {
  const link = document.createElement("a");
  link.href = window.location.href;
  link.textContent = "reload for its actions";
  stateEl.append(" · ", link);
}

function startTail(pre) {
  const url = pre.dataset.url;
  const stateEl = document.getElementById("tail-state");
  const style = { fg: null, bg: null, bold: false };
  let offset = 0;
  async function poll() {
    let answer;
    try {
      const resp = await fetch(url + "?offset=" + offset, { headers: { Accept: "application/json" } });
      if (!resp.ok) throw new Error("HTTP " + resp.status);
      answer = await resp.json();
    } catch (err) {
      if (stateEl) stateEl.textContent = "tail error: " + err.message + " (retrying)";
      setTimeout(poll, 2000);
      return;
    }
    if (answer.data) {
      const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      renderAnsi(pre, answer.data, style);
      if (atBottom) pre.scrollTop = pre.scrollHeight;
    }
    offset = answer.offset;
    pre.dataset.offset = String(offset);
    pre.dataset.state = answer.state;
    if (stateEl) stateEl.textContent = answer.ended ? "ended: " + answer.state : "live: " + answer.state;
    const status = document.getElementById("msg-status");
    if (status && answer.status !== undefined) status.textContent = answer.status;
    const bar = document.getElementById("msg-progress");
    if (bar && answer.progress) bar.value = answer.progress.fraction;
    const badge = document.getElementById("msg-state");
    if (badge) { badge.textContent = answer.state; badge.className = "badge " + answer.state; }
    if (answer.ended) {
      pre.dataset.ended = "true";
      if (stateEl && pre.dataset.initial !== answer.state) offerReload(stateEl);
      return;
    }
    setTimeout(poll, answer.data ? 200 : 700);
  }
  poll();
}

document.querySelectorAll("pre.tail[data-url]").forEach(startTail);

// Live parts of a page (<div class="live" data-refresh="5" id="live-...">): fetched again
// every few seconds and swapped in place, so the dashboard and queue page stay current
// without a reload.  Skipped while the user is typing or the tab is hidden.
function startLive(block) {
  const every = Math.max(2, Number(block.dataset.refresh) || 5) * 1000;
  async function refresh() {
    const typing = document.activeElement && block.contains(document.activeElement) &&
      /INPUT|SELECT|TEXTAREA/.test(document.activeElement.tagName);
    if (!document.hidden && !typing) {
      try {
        const resp = await fetch(window.location.href, { headers: { Accept: "text/html" } });
        if (resp.ok) {
          const doc = new DOMParser().parseFromString(await resp.text(), "text/html");
          const fresh = doc.getElementById(block.id);
          if (fresh && fresh.innerHTML !== block.innerHTML) block.innerHTML = fresh.innerHTML;
          block.dataset.refreshed = String(Date.now());
        }
      } catch (err) { /* the next round tries again */ }
    }
    setTimeout(refresh, every);
  }
  setTimeout(refresh, every);
}

document.querySelectorAll(".live[data-refresh][id]").forEach(startLive);
