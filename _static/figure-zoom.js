// Tap a figure to open it at full size: on a phone the labels of a scaled-down plot are too small to
// read. Each figure image gets a link to its own file (no other behaviour changes).
document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("figure img, div.cell_output img").forEach((img) => {
    if (img.closest("a")) return;
    const link = document.createElement("a");
    link.href = img.src;
    link.className = "figure-zoom";
    link.title = "Open the figure at full size";
    img.replaceWith(link);
    link.appendChild(img);
  });
});
