// A box that scrolls sideways (a long equation or formula, a wide table on a phone) fades at each
// edge that has more to show, so a reader sees there is more and which way to swipe. reading.css
// draws the fade from the classes set here; they follow the scroll position and the box's size.
(() => {
  const BOXES = "div.math, span.math, .pst-scrollable-table-container, .table-wrapper";

  const mark = (box) => {
    if (box.matches("span.math")) {
      // Only a formula wider than the column scrolls: most formulas' glyphs overhang their box
      // by a few pixels, which would otherwise make every one a scroll box (with a scroll bar on a
      // desktop) and fade it.
      const formula = box.querySelector("mjx-container");
      const wide = formula !== null && formula.getBoundingClientRect().width > box.clientWidth + 1;
      box.classList.toggle("math-scrolls", wide);
      if (!wide) {
        box.classList.remove("scroll-more-left", "scroll-more-right");
        return;
      }
    }
    const more = box.scrollWidth - box.clientWidth;
    box.classList.toggle("scroll-more-left", more > 1 && box.scrollLeft > 1);
    box.classList.toggle("scroll-more-right", more > 1 && box.scrollLeft < more - 1);
  };

  const markAll = () => document.querySelectorAll(BOXES).forEach(mark);

  document.addEventListener("DOMContentLoaded", () => {
    const resized = new ResizeObserver((entries) => entries.forEach((entry) => mark(entry.target)));
    document.querySelectorAll(BOXES).forEach((box) => {
      box.addEventListener("scroll", () => mark(box), { passive: true });
      resized.observe(box);
    });
    markAll();
  });
  // MathJax typesets after the page has loaded; a formula's width is known only then.
  window.addEventListener("load", () => {
    markAll();
    const startup = window.MathJax && window.MathJax.startup && window.MathJax.startup.promise;
    if (startup) startup.then(markAll);
  });
})();
