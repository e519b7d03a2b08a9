// The admin's additions (loaded by templates/admin/base_site.html).
// Django's filter widgets (many-to-many fields such as a group's permissions) name their
// search icon with aria-label on a bare <span>, which no role permits, so screen readers may
// skip the words. As an image the icon keeps its name. The widgets are built on "load";
// this listener is added after theirs, so it runs after them.
window.addEventListener("load", () => {
  for (const icon of document.querySelectorAll(".help-tooltip[aria-label]:not([role])")) {
    icon.setAttribute("role", "img");
  }
});
