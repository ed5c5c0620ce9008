// rqsys web UI: a message's output in a terminal (xterm.js, vendor/), the live parts of
// a page, and the light/dark choice.  Plain JS, no build step.
"use strict";

const TAIL_START = 256 * 1024;  // a page opens on the log's last this much
const TERMINAL = {
  convertEol: true, disableStdin: true, scrollback: 100000, fontSize: 13,
  fontFamily: 'ui-monospace, "DejaVu Sans Mono", monospace', cursorInactiveStyle: "none",
  theme: { background: "#14171f", foreground: "#d8dde8", cursor: "#14171f" },
  // a script's own colours (#000087 on this background: 1.15:1) lightened to WCAG AA
  minimumContrastRatio: 4.5,
};

function mib(bytes) {
  return bytes >= 1048576 ? (bytes / 1048576).toFixed(1) + " MiB" : Math.ceil(bytes / 1024) + " KiB";
}

function offerReload(stateEl) {
  const link = document.createElement("a");
  link.href = window.location.href;
  link.textContent = "reload for its actions";
  stateEl.append(" · ", link);
}

// A poll's text handed to the terminal in slices: it draws its queue of writes a few ms
// at a time between frames, but cannot split one long write.
const SLICE = 16 * 1024;
function written(term, data) {
  return new Promise((done) => {
    for (let at = 0; at < data.length; at += SLICE) {
      term.write(data.slice(at, at + SLICE), at + SLICE >= data.length ? done : undefined);
    }
  });
}

// The log polled from tail.json into a terminal: it parses colours (16, 256, truecolor),
// bold, underline, inverse, \r and escapes split across polls as a terminal does, drops
// OSC titles, and writes in time slices of its own (a large poll never freezes the page).
// Each poll waits for the previous one's text to be written.
function startTail(box) {
  const url = box.dataset.url;
  const stateEl = document.getElementById("tail-state");
  const term = new Terminal(TERMINAL);
  const fit = new FitAddon.FitAddon();
  term.loadAddon(fit);
  term.open(box);
  fit.fit();
  new ResizeObserver(() => fit.fit()).observe(box);
  box.rqTerm = term;  // the browser tests read what it shows
  let offset = 0, from = "last", round = 0, polling = false;

  function say(text) { if (stateEl) stateEl.textContent = text; }

  function offerAll(skipped, size) {
    const bar = document.getElementById("tail-more");
    if (!bar || skipped <= 0) return;
    bar.hidden = false;
    bar.querySelector("span").textContent =
      "Showing the last " + mib(size - skipped) + " of " + mib(size) + ".";
    bar.querySelector("button").onclick = () => {
      bar.hidden = true;
      round += 1;  // an answer on its way is for the round before: dropped
      offset = 0;
      from = "start";
      term.reset();
      if (!polling) poll();
    };
  }

  async function poll() {
    polling = true;
    const mine = round;
    const query = from === "last" ? "?last=" + TAIL_START : "?offset=" + offset;
    let answer;
    try {
      const resp = await fetch(url + query, { headers: { Accept: "application/json" } });
      if (!resp.ok) throw new Error("HTTP " + resp.status);
      answer = await resp.json();
    } catch (err) {
      say("tail error: " + err.message + " (retrying)");
      setTimeout(poll, 2000);
      return;
    }
    if (mine !== round) { poll(); return; }
    if (from === "last") offerAll(answer.from, answer.size);
    from = "offset";
    if (answer.data) await written(term, answer.data);
    if (mine !== round) { poll(); return; }  // "load all" while this was drawn: start over
    offset = answer.offset;
    box.dataset.offset = String(offset);
    box.dataset.state = answer.state;
    const over = ["done", "err", "relayed"].includes(answer.state);
    say(answer.ended ? "ended: " + answer.state
        : over ? "ended: " + answer.state + " (showing the rest of its output)"
        : "live: " + answer.state);
    const status = document.getElementById("msg-status");
    if (status && answer.status !== undefined) status.textContent = answer.status;
    const bar = document.getElementById("msg-progress");
    if (bar && answer.progress) bar.value = answer.progress.fraction;
    const badge = document.getElementById("msg-state");
    if (badge) { badge.textContent = answer.state; badge.className = "badge " + answer.state; }
    if (answer.ended) {
      polling = false;
      box.dataset.ended = "true";
      if (stateEl && box.dataset.initial !== answer.state) offerReload(stateEl);
      return;
    }
    setTimeout(poll, answer.data ? 50 : 700);
  }
  poll();
}

function loaded(tag, attrs) {
  return new Promise((ok, failed) => {
    const node = Object.assign(document.createElement(tag), attrs);
    node.onload = ok;
    node.onerror = () => failed(new Error("cannot load " + (attrs.src || attrs.href)));
    document.head.append(node);
  });
}

// The terminal is loaded only on a page that shows output.
const tails = document.querySelectorAll("#tail[data-url]");
if (tails.length) {
  const vendor = tails[0].dataset.vendor;
  Promise.all([loaded("link", { rel: "stylesheet", href: vendor + "/xterm.css" }),
               loaded("script", { src: vendor + "/xterm.js" })])
    .then(() => loaded("script", { src: vendor + "/addon-fit.js" }))
    .then(() => tails.forEach(startTail))
    .catch((err) => {
      const stateEl = document.getElementById("tail-state");
      if (stateEl) stateEl.textContent = "the terminal did not load (" + err.message +
        "): the output is in the log files above";
    });
}

// Live parts of a page (<div class="live" data-refresh="5" id="live-...">): fetched again
// every few seconds and swapped in place, so the dashboard and queue page stay current
// without a reload.  Skipped while the user is typing or choosing, or the tab is hidden.
// An unchanged page costs a 304 (the browser sends the ETag of its copy).
// What the focused control is, in words that survive a swap: its id, else its
// role in the page (the form it posts to, its name and value, its label).
function focusKey(el) {
  if (el.id) return "#" + el.id;
  const form = el.form ? el.form.getAttribute("action") || "" : "";
  return [el.tagName, form, el.name || "", el.value || "", el.getAttribute("aria-label") || "",
    el.getAttribute("href") || "", el.textContent.trim()].join("|");
}

// Swap a live block's content; the control that had the keyboard focus has it again
// in the new content (the same control, found by focusKey), and nothing scrolls.
function swapKeepingFocus(block, fresh) {
  const had = document.activeElement;
  const key = had && had !== document.body && block.contains(had) ? focusKey(had) : null;
  block.innerHTML = fresh.innerHTML;
  if (typeof roveTables === "function") roveTables();  // the new rows' Tab stops
  if (!key) return;
  const same = key.startsWith("#") ? document.getElementById(key.slice(1))
    : Array.from(block.querySelectorAll(had.tagName)).find((el) => focusKey(el) === key);
  if (same) same.focus({ preventScroll: true });
}

// How often live parts are fetched: the operator's pick (1 to 15 s, or off), kept by
// this browser; the page's own data-refresh until one is picked.
const RATE_KEY = "rq-live-every";
function liveEvery(block) {
  let picked = null;
  try { picked = localStorage.getItem(RATE_KEY); } catch (err) { /* private mode */ }
  if (picked === "off") return 0;
  const seconds = Number(picked) || Number(block.dataset.refresh) || 5;
  return Math.min(15, Math.max(1, seconds)) * 1000;
}

const liveBlocks = [];  // each: { block, now(), schedule() } (the "r" key refreshes them)

// Pushed: one server-sent event stream a tab (/live) says when the page changed; the
// blocks are then fetched and swapped as a poll would.  Without EventSource, or when
// the stream is refused or closed, each block polls at the rate instead.
let stream = null;
function streaming() { return stream !== null && stream.readyState !== 2; }  // 2: CLOSED
function openStream() {
  if (stream) stream.close();
  stream = null;
  const every = liveBlocks.length ? liveEvery(liveBlocks[0].block) : 0;
  const brand = document.querySelector("a.brand");
  if (!every || document.hidden || !window.EventSource || !brand) return;
  const url = new URL("live", brand.href);
  url.searchParams.set("page", window.location.pathname + window.location.search);
  url.searchParams.set("every", String(every / 1000));
  stream = new EventSource(url);
  stream.addEventListener("changed", () => liveBlocks.forEach((live) => live.now()));
  stream.addEventListener("error", () => {
    if (stream && stream.readyState === 2) {  // refused or ended for good: poll instead
      stream = null;
      liveBlocks.forEach((live) => live.schedule());
    }
  });
}

function startLive(block) {
  let timer = null;
  async function refresh() {
    clearTimeout(timer);
    timer = null;
    const busy = document.activeElement && block.contains(document.activeElement) &&
      /INPUT|SELECT|TEXTAREA/.test(document.activeElement.tagName);
    const chosen = block.querySelector("input.pick:checked");
    if (document.hidden) return;  // paused: visibilitychange starts it again
    if (!busy && !chosen) {
      try {
        const resp = await fetch(window.location.href, { headers: { Accept: "text/html" } });
        if (resp.ok) {
          const doc = new DOMParser().parseFromString(await resp.text(), "text/html");
          const fresh = doc.getElementById(block.id);
          if (fresh && fresh.innerHTML !== block.innerHTML) swapKeepingFocus(block, fresh);
          block.dataset.refreshed = String(Date.now());
        }
      } catch (err) { /* the next round tries again */ }
    }
    schedule();
  }
  function schedule() {  // a poll's next round, unless the stream says when
    clearTimeout(timer);
    const every = liveEvery(block);
    timer = every && !document.hidden && !streaming() ? setTimeout(refresh, every) : null;
  }
  liveBlocks.push({ block, now: refresh, schedule });
}

document.addEventListener("visibilitychange", () => {
  if (document.hidden) {
    if (stream) stream.close();
    stream = null;
    liveBlocks.forEach((live) => live.schedule());  // clears their timers: hidden
  } else {
    openStream();
    liveBlocks.forEach((live) => live.now());  // brought up to date as it is shown
  }
});

document.querySelectorAll(".live[data-refresh][id]").forEach(startLive);
openStream();
liveBlocks.forEach((live) => live.schedule());

// The live rate picker in the header: shown on pages with live parts.
const ratePicker = document.getElementById("live-rate");
if (ratePicker && liveBlocks.length) {
  ratePicker.closest(".live-rate").hidden = false;
  let picked = null;
  try { picked = localStorage.getItem(RATE_KEY); } catch (err) { /* private mode */ }
  ratePicker.value = picked || liveBlocks[0].block.dataset.refresh || "5";
  ratePicker.addEventListener("change", () => {
    try { localStorage.setItem(RATE_KEY, ratePicker.value); } catch (err) { /* private mode */ }
    openStream();
    liveBlocks.forEach((live) => live.schedule());
  });
}

// The light/dark choice: the system's until the user picks one, then theirs (kept by
// this browser; theme.js applies it before the page is drawn).
const themeButton = document.getElementById("theme");
if (themeButton) {
  const dark = () => document.documentElement.dataset.theme === "dark" ||
    (!document.documentElement.dataset.theme && matchMedia("(prefers-color-scheme: dark)").matches);
  const show = () => {
    themeButton.setAttribute("aria-pressed", String(dark()));
    themeButton.textContent = dark() ? "Light theme" : "Dark theme";
  };
  themeButton.addEventListener("click", () => {
    const next = dark() ? "light" : "dark";
    document.documentElement.dataset.theme = next;
    try { localStorage.setItem("rq-theme", next); } catch (err) { /* private mode */ }
    show();
  });
  show();
}

// Chosen rows: "all on this page" ticks every row's box; the bulk forms send the ticked ids.
document.addEventListener("change", (event) => {
  const all = event.target.closest("input.pick-all");
  if (!all) return;
  const table = all.closest("table");
  if (table) table.querySelectorAll("input.pick").forEach((box) => { box.checked = all.checked; });
});

// Shift-click ticks or clears every row's box between the last one clicked and this one.
let lastPick = null;
document.addEventListener("click", (event) => {
  const box = event.target.closest("input.pick");
  if (!box) return;
  const table = box.closest("table");
  if (event.shiftKey && lastPick && lastPick !== box && table && table.contains(lastPick)) {
    const boxes = Array.from(table.querySelectorAll("input.pick"));
    const [from, to] = [boxes.indexOf(lastPick), boxes.indexOf(box)].sort((a, b) => a - b);
    boxes.slice(from, to + 1).forEach((one) => { one.checked = box.checked; });
  }
  lastPick = box;
});

// After an action (a form posted, the page shown again), the keyboard focus goes back
// to the control that acted, or to the first control of the same form (pause became
// resume), instead of the top of the page.
const FOCUS_KEY = "rq-focus-after";
document.addEventListener("submit", (event) => {
  const form = event.target;
  if ((form.method || "").toLowerCase() !== "post") return;
  const control = event.submitter || document.activeElement;
  const said = control && control.getAttribute ? control.getAttribute("aria-label") : "";
  try {
    sessionStorage.setItem(FOCUS_KEY, JSON.stringify(
      { action: form.getAttribute("action") || "", said: said || "", at: Date.now() }));
  } catch (err) { /* private mode */ }
});
(function focusAfterAction() {
  let was = null;
  try {
    was = JSON.parse(sessionStorage.getItem(FOCUS_KEY) || "null");
    sessionStorage.removeItem(FOCUS_KEY);
  } catch (err) { return; }
  if (!was || Date.now() - was.at > 60000) return;
  const controls = Array.from(document.querySelectorAll("button, a, input, select"));
  const same = (was.said && controls.find((el) => el.getAttribute("aria-label") === was.said)) ||
    Array.from(document.querySelectorAll("form")).filter(
      (form) => form.getAttribute("action") === was.action)
      .map((form) => form.querySelector("button, input[type=submit]")).find(Boolean);
  if (same) same.focus();
})();

// Keyboard shortcuts (? lists them): / search, g d dashboard, r refresh, t theme.
const keysDialog = document.getElementById("keys");
const keysOpen = document.getElementById("keys-open");
if (keysDialog && keysOpen) keysOpen.addEventListener("click", () => keysDialog.showModal());
let pendingG = 0;
document.addEventListener("keydown", (event) => {
  const target = event.target;
  if (event.ctrlKey || event.metaKey || event.altKey || event.defaultPrevented) return;
  if (target.closest && target.closest("input, select, textarea, [contenteditable], .xterm")) return;
  if (keysDialog && keysDialog.open) return;  // Esc closes it
  const key = event.key;
  if (pendingG && Date.now() - pendingG < 1500 && key === "d") {
    pendingG = 0;
    window.location.href = document.querySelector("a.brand").getAttribute("href");
    event.preventDefault();
    return;
  }
  pendingG = key === "g" ? Date.now() : 0;
  if (key === "/") {
    const find = document.querySelector("form.find input[type=search]");
    if (find) { find.focus(); event.preventDefault(); }
  } else if (key === "?" && keysDialog) {
    keysDialog.showModal();
    event.preventDefault();
  } else if (key === "r") {
    if (liveBlocks.length) liveBlocks.forEach((live) => live.now());
    else window.location.reload();
    event.preventDefault();
  } else if (key === "t" && themeButton) {
    themeButton.click();
    event.preventDefault();
  }
});

// Completion in the search boxes: the word being typed completes to a key, a state or
// a queue (queue:etl...), each offered as the whole text with that word finished, so
// the browser's own list shows them.
const searchKeys = document.getElementById("search-keys");
if (searchKeys) {
  const words = Array.from(searchKeys.options).map((option) => option.value);
  document.querySelectorAll("input[list=search-keys]").forEach((box) => {
    box.addEventListener("input", () => {
      const text = box.value;
      const cut = text.lastIndexOf(" ") + 1;
      const head = text.slice(0, cut), typed = text.slice(cut);
      const offered = typed ? words.filter((word) => word.startsWith(typed) && word !== typed)
        : [];
      searchKeys.replaceChildren(...offered.slice(0, 20).map(
        (word) => Object.assign(document.createElement("option"), { value: head + word })));
    });
  });
}

// Tables of many rows of controls (the dashboard's queues): one Tab stop a row, the
// arrow keys across a row's links and buttons and to the row above or below (a roving
// tabindex), so a fifth queue's pause is a few keys away, not thirty Tabs.
function rowControls(row) {
  return Array.from(row.querySelectorAll(
    "a[href], button:not([disabled]), input:not([type=hidden]):not([disabled]), select"));
}
function roveRow(row, current) {  // the row's one Tab stop: the control last in focus
  const controls = rowControls(row);
  const stop = controls.includes(current) ? current : controls[0];
  controls.forEach((el) => { el.tabIndex = el === stop ? 0 : -1; });
}
function roveTables() {
  document.querySelectorAll("table.roving tbody tr").forEach(
    (row) => roveRow(row, document.activeElement));  // the focus is kept a stop
}
roveTables();
document.addEventListener("focusin", (event) => {
  const row = event.target.closest && event.target.closest("table.roving tbody tr");
  if (row) roveRow(row, event.target);
});
document.addEventListener("keydown", (event) => {
  const arrows = ["ArrowLeft", "ArrowRight", "ArrowUp", "ArrowDown"];
  if (!arrows.includes(event.key) || event.altKey || event.ctrlKey || event.metaKey) return;
  const row = event.target.closest && event.target.closest("table.roving tbody tr");
  if (!row || event.target.matches("input:not([type=checkbox]), select, textarea")) return;
  const controls = rowControls(row);
  const at = controls.indexOf(event.target);
  let next = null;
  if (event.key === "ArrowRight" || event.key === "ArrowLeft") {
    next = controls[at + (event.key === "ArrowRight" ? 1 : -1)];
  } else {
    const rows = Array.from(row.parentElement.rows);
    const other = rows[rows.indexOf(row) + (event.key === "ArrowDown" ? 1 : -1)];
    const there = other ? rowControls(other) : [];
    next = there[Math.min(Math.max(at, 0), there.length - 1)];
  }
  if (next) {
    event.preventDefault();
    next.focus();
  }
});
