// Keyboard shortcuts for the console. Moving and opening only: every decision still needs its
// form's confirmation box ticked and its button pressed.
//   queue:         j / k  move the selection,  o / Enter  open the selected approval
//   approval page: a  approve,  s  resolve,  r  reject   (opens that decision's form)
(function () {
  "use strict";
  var selectedId = null;

  function rows() {
    return Array.prototype.slice.call(document.querySelectorAll("tr[data-queue-row]"));
  }

  function paint(scroll) {
    var found = null;
    rows().forEach(function (row) {
      var on = row.getAttribute("data-id") === selectedId;
      row.classList.toggle("selected", on);
      row.setAttribute("aria-selected", on ? "true" : "false");
      if (on) { found = row; }
    });
    if (found && scroll) { found.scrollIntoView({ block: "nearest" }); }
    return found;
  }

  function move(delta) {
    var all = rows();
    if (!all.length) { return; }
    var index = all.findIndex(function (r) { return r.getAttribute("data-id") === selectedId; });
    index = index < 0 ? (delta > 0 ? 0 : all.length - 1)
                      : Math.min(all.length - 1, Math.max(0, index + delta));
    selectedId = all[index].getAttribute("data-id");
    paint(true);
  }

  function openSelected() {
    var row = paint(false);
    if (row) { window.location.href = row.getAttribute("data-href"); return true; }
    return false;
  }

  function openDecision(name) {
    var details = document.getElementById("decide-" + name);
    if (!details) { return false; }
    document.querySelectorAll("details.decision").forEach(function (d) {
      d.open = d === details;
    });
    var field = details.querySelector("textarea, input[type=text]");
    if (field) { field.focus(); }
    return true;
  }

  function typing(target) {
    var tag = target && target.tagName;
    return tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT" || tag === "BUTTON" ||
           tag === "A" || tag === "SUMMARY" || (target && target.isContentEditable);
  }

  document.addEventListener("keydown", function (event) {
    if (event.defaultPrevented || event.ctrlKey || event.metaKey || event.altKey) { return; }
    if (typing(event.target)) { return; }
    var handled = false;
    switch (event.key) {
      case "j": move(1); handled = true; break;
      case "k": move(-1); handled = true; break;
      case "o": case "Enter": handled = openSelected(); break;
      case "a": handled = openDecision("approve"); break;
      case "s": handled = openDecision("resolve"); break;
      case "r": handled = openDecision("reject"); break;
    }
    if (handled) { event.preventDefault(); }
  });

  // A click on a queue row opens it, as its link does.
  document.addEventListener("click", function (event) {
    var row = event.target.closest && event.target.closest("tr[data-queue-row]");
    if (row && !event.target.closest("a")) { window.location.href = row.getAttribute("data-href"); }
  });

  // The queue list is replaced by its poll every few seconds: keep the selection across swaps.
  document.addEventListener("htmx:afterSwap", function () { paint(false); });
})();
