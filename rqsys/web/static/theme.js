// The user's light/dark choice, applied before the page is drawn (rq.js changes it).
"use strict";
try {
  const theme = localStorage.getItem("rq-theme");
  if (theme === "dark" || theme === "light") document.documentElement.dataset.theme = theme;
} catch (err) { /* private mode: the system's choice */ }
