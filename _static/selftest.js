// The self-test page (selftest.md): its questions in a random order on every visit, and a button
// that draws a new order. Plain script, no network. On other pages it does nothing.
document.addEventListener("DOMContentLoaded", () => {
  const list = document.querySelector("div.selftest");
  if (!list) return;
  const items = () => Array.from(list.querySelectorAll(":scope > div.selftest-item"));
  const order = () => items().map((item) => item.dataset.question).join(",");

  items().forEach((item, i) => { item.dataset.question = String(i + 1); });

  function shuffle() {
    const before = order();
    let drawn;
    // A new order every time: with one question there is no other order to draw.
    do {
      drawn = items();
      for (let i = drawn.length - 1; i > 0; i--) {
        const j = Math.floor(Math.random() * (i + 1));
        [drawn[i], drawn[j]] = [drawn[j], drawn[i]];
      }
      drawn.forEach((item) => list.appendChild(item));
    } while (drawn.length > 1 && order() === before);
    list.querySelectorAll("details").forEach((d) => { d.open = false; });
  }

  const bar = document.createElement("p");
  bar.className = "selftest-controls";
  const button = document.createElement("button");
  button.type = "button";
  button.className = "btn btn-sm btn-outline-primary selftest-shuffle";
  button.textContent = "Shuffle · 换个顺序";
  button.addEventListener("click", shuffle);
  bar.appendChild(button);
  list.parentNode.insertBefore(bar, list);
  shuffle();
});
