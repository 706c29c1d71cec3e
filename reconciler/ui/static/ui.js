// flink-reconciler dashboard: live regions, filters without a reload, copy buttons, running clocks.
// Our own small script (no framework, no inline handlers; the CSP allows only this file).
(function () {
  "use strict";
  var body = document.body;
  var every = parseInt(body.getAttribute("data-refresh") || "0", 10);
  var timer = null;
  var busy = false;

  function fmt(seconds) {
    var s = Math.max(0, Math.floor(seconds));
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m " + String(s % 60).padStart(2, "0") + "s";
    if (s < 86400) return Math.floor(s / 3600) + "h " + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + "m";
    return Math.floor(s / 86400) + "d " + Math.floor(s % 86400 / 3600) + "h";
  }

  function tickClocks() {
    var now = Date.now();
    document.querySelectorAll("[data-since]").forEach(function (el) {
      var t = Date.parse(el.getAttribute("data-since"));
      if (!isNaN(t)) el.textContent = fmt((now - t) / 1000);
    });
  }

  function refresh() {
    if (busy || document.hidden) return schedule();
    busy = true;
    fetch(location.pathname + location.search, {
      headers: {"Accept": "text/html", "X-UI-Refresh": "1"}, cache: "no-store", credentials: "same-origin"
    }).then(function (r) {
      if (!r.ok) throw new Error("HTTP " + r.status);
      return r.text();
    }).then(function (html) {
      var doc = new DOMParser().parseFromString(html, "text/html");
      document.querySelectorAll("[data-live]").forEach(function (el) {
        var fresh = el.id && doc.getElementById(el.id);
        if (!fresh) return;
        // A <details> the reader opened stays open (the server sends them closed).
        el.querySelectorAll("details[open][id]").forEach(function (d) {
          var f = fresh.querySelector("details[id='" + d.id + "']");
          if (f) f.setAttribute("open", "");
        });
        if (fresh.innerHTML !== el.innerHTML) el.innerHTML = fresh.innerHTML;
      });
      // A page that stops refreshing (/plan once its plan is there) says so in its data-refresh.
      every = parseInt(doc.body.getAttribute("data-refresh") || "0", 10);
      body.classList.remove("stale");
      tickClocks();
    }).catch(function () {
      body.classList.add("stale");
    }).finally(function () {
      busy = false;
      schedule();
    });
  }

  function schedule() {
    if (!every) return;
    clearTimeout(timer);
    timer = setTimeout(refresh, every);
  }

  // Filters apply as you type: the URL follows (bookmarkable), the live regions are fetched at once.
  var form = document.getElementById("filters");
  if (form) {
    body.classList.add("js");
    var debounce = null;
    var apply = function () {
      var params = new URLSearchParams(new FormData(form));
      params.forEach(function (v, k) { if (!v) params.delete(k); });
      Array.from(params.keys()).forEach(function (k) { if (!params.get(k)) params.delete(k); });
      var qs = params.toString();
      history.replaceState(null, "", location.pathname + (qs ? "?" + qs : ""));
      clearTimeout(timer);
      refresh();
    };
    form.querySelectorAll("[data-auto]").forEach(function (el) {
      el.addEventListener(el.tagName === "SELECT" ? "change" : "input", function () {
        clearTimeout(debounce);
        debounce = setTimeout(apply, 250);
      });
    });
    form.addEventListener("submit", function (ev) { ev.preventDefault(); apply(); });
  }

  // Copy a CLI command: the page itself never acts.
  document.addEventListener("click", function (ev) {
    var button = ev.target.closest("button[data-copy]");
    if (!button) return;
    var source = document.getElementById(button.getAttribute("data-copy"));
    if (!source) return;
    var text = source.textContent.trim();
    var done = function () {
      button.textContent = "Copied";
      button.classList.add("done");
      setTimeout(function () { button.textContent = "Copy"; button.classList.remove("done"); }, 1500);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, function () { select(source); });
    } else {
      select(source);
    }
  });

  function select(el) {
    var range = document.createRange();
    range.selectNodeContents(el);
    var sel = window.getSelection();
    sel.removeAllRanges();
    sel.addRange(range);
  }

  setInterval(tickClocks, 1000);
  document.addEventListener("visibilitychange", function () { if (!document.hidden) refresh(); });
  schedule();
})();
