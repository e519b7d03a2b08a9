// The console's small behaviours. Moving and opening only: every decision still needs its
// form's confirmation box ticked and its button pressed.
//   queue:         j / k  move the selection,  o / Enter  open the selected approval,
//                  x  tick it for a batch decision
//   approval page: a / s / r / e  open a decision's form,  Escape closes it (focus goes back
//                  to the decision's summary, the control that opens it)
// The single-letter keys can be turned off ("Single-key shortcuts", remembered in this browser);
// they never act while typing in a field. j / k move the keyboard focus itself (to the row's
// link), so a screen reader announces the approval. After a decision the focus moves to its
// outcome, which is a status region, so it is announced.
// Ages ("3m 12s ago") keep counting between renders, and a field's old error goes once the
// field is edited.
(function () {
  "use strict";
  // The queue's selection lives in this history entry's state, so Back to the queue finds it.
  var selectedId = (window.history.state && window.history.state.queueSelection) || null;

  function rows() {
    return Array.prototype.slice.call(document.querySelectorAll("tr[data-queue-row]"));
  }

  function remember() {
    var state = Object.assign({}, window.history.state || {}, { queueSelection: selectedId });
    window.history.replaceState(state, "");
  }

  // Single-key shortcuts: on unless turned off in this browser (a preference, nothing else).
  var SHORTCUTS = "console.shortcuts";

  function shortcutsOn() {
    try { return window.localStorage.getItem(SHORTCUTS) !== "off"; } catch (e) { return true; }
  }

  function showShortcuts() {
    var on = shortcutsOn();
    document.documentElement.classList.toggle("shortcuts-off", !on);
    document.querySelectorAll("input[data-shortcuts]").forEach(function (box) {
      box.checked = on;
    });
  }
  showShortcuts();

  function paint(focus) {
    var found = null;
    rows().forEach(function (row) {
      var on = row.getAttribute("data-id") === selectedId;
      row.classList.toggle("selected", on);
      if (on) { found = row; }
    });
    var link = found && found.querySelector("a.open");
    if (link && focus) { link.focus(); }  // scrolls it into view, and is announced
    return found;
  }

  function move(delta) {
    var all = rows();
    if (!all.length) { return; }
    var index = all.findIndex(function (r) { return r.getAttribute("data-id") === selectedId; });
    index = index < 0 ? (delta > 0 ? 0 : all.length - 1)
                      : Math.min(all.length - 1, Math.max(0, index + delta));
    selectedId = all[index].getAttribute("data-id");
    remember();
    paint(true);
  }

  function open(row) {
    selectedId = row.getAttribute("data-id");
    remember();
    window.location.href = row.getAttribute("data-href");
  }

  function openSelected() {
    var row = paint(false);
    if (row) { open(row); return true; }
    return false;
  }

  function openDecision(key) {
    var all = Array.prototype.slice.call(document.querySelectorAll("details.decision"));
    var details = document.getElementById("decide-" + key);
    if (!details) { return false; }
    all.forEach(function (d) { d.open = d === details; });
    var field = details.querySelector("textarea, input[type=text]");
    if (field) { field.focus(); }
    return true;
  }

  function closeDecisions() {
    var closed = null;
    document.querySelectorAll("details.decision[open]").forEach(function (d) {
      d.open = false;
      closed = d;
    });
    // Back to the control that opens it (its summary), not lost to the page's top.
    if (closed) { closed.querySelector("summary").focus(); }
    return closed !== null;
  }

  function typing(target) {
    var tag = target && target.tagName;
    return tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT" ||
           (target && target.isContentEditable);
  }

  document.addEventListener("keydown", function (event) {
    if (event.defaultPrevented || event.ctrlKey || event.metaKey || event.altKey) { return; }
    if (event.key === "Escape") {  // also from inside a form's fields
      if (closeDecisions()) { event.preventDefault(); }
      return;
    }
    if (typing(event.target) || !shortcutsOn()) { return; }
    // Enter on a link or button is theirs; on the page itself it opens the selected row.
    var onPage = event.target === document.body || event.target === document.documentElement;
    var handled = false;
    switch (event.key) {
      case "j": move(1); handled = true; break;
      case "k": move(-1); handled = true; break;
      case "o": handled = openSelected(); break;
      case "Enter": handled = onPage && openSelected(); break;
      case "x": handled = tickSelected(); break;
      case "a": handled = openDecision("approve"); break;
      case "s": handled = openDecision("resolve"); break;
      case "r": handled = openDecision("reject"); break;
      case "e": handled = openDecision("edit"); break;
    }
    if (handled) { event.preventDefault(); }
  });

  // A click on a queue row opens it, as its link does.
  document.addEventListener("click", function (event) {
    var row = event.target.closest && event.target.closest("tr[data-queue-row]");
    if (!row) { return; }
    if (event.target.closest("td.pick, input, label")) { return; }  // ticking, not opening
    if (event.target.closest("a")) {
      selectedId = row.getAttribute("data-id");
      remember();
      return;
    }
    open(row);
  });

  // Editing a field clears the error shown for its earlier value.
  document.addEventListener("input", function (event) {
    var holder = event.target.closest && event.target.closest("p");
    if (!holder) { return; }
    holder.querySelectorAll("[data-field-error]").forEach(function (e) { e.remove(); });
  });

  // Ages and countdowns, from the moment the server rendered them.
  function duration(seconds) {
    var sign = seconds < 0 ? "-" : "";
    seconds = Math.floor(Math.abs(seconds));
    var d = Math.floor(seconds / 86400), h = Math.floor(seconds % 86400 / 3600);
    var m = Math.floor(seconds % 3600 / 60), s = seconds % 60;
    if (d) { return sign + d + "d " + h + "h"; }
    if (h) { return sign + h + "h " + m + "m"; }
    if (m) { return sign + m + "m " + s + "s"; }
    return sign + s + "s";
  }

  // The server's clock decides ages, not this machine's: the offset between them at load.
  var rendered = Date.parse(document.body.getAttribute("data-now") || "");
  var offset = isNaN(rendered) ? 0 : rendered - Date.now();

  function tick() {
    var now = Date.now() + offset;
    document.querySelectorAll("time[data-age]").forEach(function (t) {
      t.textContent = duration((now - Date.parse(t.getAttribute("datetime"))) / 1000);
    });
    document.querySelectorAll("time[data-until]").forEach(function (t) {
      var left = (Date.parse(t.getAttribute("datetime")) - now) / 1000;
      t.textContent = duration(Math.max(0, left));
    });
  }
  window.setInterval(tick, 1000);

  // Batch decisions: ticked boxes, a select-all, and how many are ticked. While any box is
  // ticked (or a note typed) the queue's poll waits, so a refresh never drops a selection.
  function picks() {
    return Array.prototype.slice.call(document.querySelectorAll("input[data-pick]"));
  }

  function counted() {
    var all = picks(), ticked = all.filter(function (p) { return p.checked; }).length;
    var count = document.querySelector("[data-pick-count]");
    if (count && all.length) {
      count.textContent = ticked ? ticked + " of " + all.length + " selected (the list holds " +
        "still until you decide or untick them)" :
        "Tick the approvals to decide together; each is decided on the request shown.";
    }
    var every = document.querySelector("input[data-pick-all]");
    if (every) {
      every.checked = all.length > 0 && ticked === all.length;
      every.indeterminate = ticked > 0 && ticked < all.length;
    }
  }

  function tickSelected() {
    var row = paint(false), box = row && row.querySelector("input[data-pick]");
    if (!box) { return false; }
    box.checked = !box.checked;
    counted();
    return true;
  }

  document.addEventListener("change", function (event) {
    var t = event.target;
    if (t.matches && t.matches("input[data-shortcuts]")) {
      try { window.localStorage.setItem(SHORTCUTS, t.checked ? "on" : "off"); } catch (e) { /* */ }
      showShortcuts();
    }
    if (t.matches && t.matches("input[data-pick-all]")) {
      picks().forEach(function (p) { p.checked = t.checked; });
    }
    if (t.matches && t.matches("input[data-pick], input[data-pick-all]")) { counted(); }
  });

  document.addEventListener("htmx:beforeRequest", function (event) {
    var elt = event.detail && event.detail.elt;
    if (!elt || elt.id !== "queue-list") { return; }
    var note = document.querySelector("#queue-list input[name=note]");
    if (picks().some(function (p) { return p.checked; }) || (note && note.value)) {
      event.preventDefault();  // the person is choosing: this poll waits for the next one
    }
  });

  // A swap replaces what may hold the focus. After a decision (a POST) the focus moves to its
  // outcome, or to what refused it; after a poll it stays where it was (the same control, or
  // the same queue row), instead of falling to the page's top.
  var focusId = null, focusRow = null;
  document.addEventListener("htmx:beforeSwap", function (event) {
    var target = event.detail && event.detail.target, active = document.activeElement;
    focusId = focusRow = null;
    if (!target || !active || !target.contains(active)) { return; }
    focusId = active.id || null;
    var row = active.closest("tr[data-queue-row]");
    focusRow = row && row.getAttribute("data-id");
  });

  function refocus(event) {
    var config = event.detail && event.detail.requestConfig;
    var target = event.detail && event.detail.target;
    // An outerHTML swap removed the target: its replacement carries the same id.
    var holder = (target && (target.isConnected ? target : document.getElementById(target.id)))
      || document;
    if (config && config.verb === "post") {
      // Why it was refused first (someone was quicker, a field's error), else the outcome.
      var outcome = holder.querySelector("#decision-panel [role=alert]") ||
        holder.querySelector("[data-field-error]") || holder.querySelector("[data-outcome]") ||
        holder.querySelector("[role=alert]");
      if (outcome) {
        if (!outcome.hasAttribute("tabindex")) { outcome.setAttribute("tabindex", "-1"); }
        outcome.focus();
        return;
      }
    }
    var again = focusId && document.getElementById(focusId);
    if (again) { again.focus({ preventScroll: true }); return; }
    if (focusRow && focusRow === selectedId) { paint(true); }
  }

  // A poll replaces the queue list: keep the selection across swaps.
  document.addEventListener("htmx:afterSwap", function (event) {
    paint(false); tick(); counted(); showShortcuts(); refocus(event);
  });
  document.addEventListener("DOMContentLoaded", function () { paint(false); counted(); });
})();
