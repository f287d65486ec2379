// The download menu of every page offers the whole book as a PDF (made by `make pdf`, which puts
// attention-derived.pdf next to the site's pages), above the theme's "print this page" entry.
document.addEventListener("DOMContentLoaded", () => {
  const menu = document.querySelector(".dropdown-download-buttons ul.dropdown-menu");
  if (!menu) return;
  const root = document.documentElement.dataset.content_root || "";
  const item = document.createElement("li");
  const link = document.createElement("a");
  link.href = root + "attention-derived.pdf";
  link.className = "btn btn-sm dropdown-item book-pdf-link";
  link.title = "Download the whole book as a PDF";
  link.innerHTML = '<span class="btn__icon-container"><i class="fas fa-book"></i></span>' +
    '<span class="btn__text-container">book .pdf</span>';
  item.appendChild(link);
  menu.insertBefore(item, menu.firstElementChild);
});
