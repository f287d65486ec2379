"""The website's own search finds each chapter by the words readers type, in English and in Chinese.

The queries come from the book itself, so the test follows the text: every phrasing of the question
index's "Also asked as · 常见问法" column (intro.md), and every chapter's key terms: its title, its
中文 question and the question of its cheat-sheet row (notebook metadata). Each query runs through
Sphinx's real search (searchtools.js with the site's language_data.js and searchindex.js) in
headless Chromium, on the built site served over http from 127.0.0.1 as `make serve` shows it; the
chapter must be among the results, with a snippet of its text.

Runs after ``make html`` (CI calls ``make check-site``); skipped when the site is not built or
Chromium is missing, like tests/pages/test_site.py.
"""

from __future__ import annotations

import functools
import html
import json
import re
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_site import CHROMIUM, SITE, run_chromium  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.requires_chromium,
    pytest.mark.skipif(not (SITE / "search.html").exists(), reason="website not built (run make html)"),
    pytest.mark.skipif(CHROMIUM is None, reason="Chromium not installed"),
]

# A row of the question index: | n | {ref}`Title <label>` | 问题 | Also asked as |
ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*\{ref\}`([^`<]+?)\s*<([^>]+)>`\s*\|([^|]+)\|([^|]+)\|\s*$", re.M)
HAN = re.compile(r"[\u3400-\u9fff]")


def _chapter_docs() -> dict[str, tuple[str, dict]]:
    """Chapter label -> (docname, what the chapter says about itself: title, 中文 question, cheat-sheet ask)."""
    docs = {}
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        first = "".join(next(c for c in nb["cells"] if c["cell_type"] == "markdown")["source"])
        label = re.search(r"^\(([\w-]+)\)=", first, re.M)
        if not label:
            continue
        docs[label.group(1)] = (
            path.relative_to(ROOT).with_suffix("").as_posix(),
            {
                "title": re.search(r"^# (.+)$", first, re.M).group(1),
                "中文": re.search(r"\*\*中文：(.+?)\*\*", first).group(1),
                "ask": nb.get("metadata", {}).get("cheatsheet", {}).get("ask", ""),
            },
        )
    return docs


def _phrasings(cell: str) -> list[str]:
    """The cell separates phrasings with "；"; an English one may list two with ", "."""
    return [p.strip() for part in cell.split("；") for p in part.split(", ") if p.strip()]


@functools.cache
def queries() -> list[dict]:
    """Every query with the chapter it must find: one entry per (query, chapter)."""
    docs = _chapter_docs()
    rows = ROW.findall((ROOT / "intro.md").read_text(encoding="utf-8"))
    assert len(rows) == len(docs) > 0, "the question index and the chapters disagree"
    out = []
    for _number, _title, label, _question, also in rows:
        doc, own = docs[label]
        for phrasing in _phrasings(also):
            kind = "also asked (中文)" if HAN.search(phrasing) else "also asked"
            out.append({"q": phrasing, "doc": doc, "kind": kind})
        for q in dict.fromkeys(k for k in (own["title"], own["中文"], own["ask"]) if k):
            out.append({"q": q, "doc": doc, "kind": "key terms"})
    return out


# Runs every query with the page's own Search object, as Search.query does, and shows each
# expected chapter as a result item (_displayItem: fetches the page and adds its snippet), once
# the index has loaded. Reports JSON in <pre id="search-probe">.
PROBE = """
<script>
window.addEventListener("load", () => {
  const cases = %s;
  const report = (data) => {
    const out = document.createElement("pre");
    out.id = "search-probe";
    out.textContent = JSON.stringify(data);
    document.body.appendChild(out);
  };
  const run = () => {
    try {
      const done = cases.map((c) => {
        const parsed = Search._parseQuery(c.q);
        const results = Search._performSearch(...parsed);
        const hit = results.find((r) => r[0] === c.doc);
        const item = {q: c.q, doc: c.doc, terms: [...parsed[1]], found: results.map((r) => r[0]), li: null};
        if (hit) {
          Search.output = document.createElement("ul");
          _displayItem(hit, parsed[1], parsed[3]);
          item.li = Search.output.lastChild;
        }
        return item;
      });
      const finished = () => done.every((d) => !d.li || d.li.querySelector("p.context"));
      let waited = 0;
      const collect = () => {
        if (!finished() && waited++ < 200) return setTimeout(collect, 50);
        report(done.map(({li, ...d}) => ({...d, snippet: li && li.querySelector("p.context")
          ? li.querySelector("p.context").textContent : null})));
      };
      collect();
    } catch (err) { report({error: String(err)}); }
  };
  const wait = () => (Search.hasIndex() ? run() : setTimeout(wait, 20));
  wait();
});
</script>
"""

PROBE_PAGE = "search-probe.html"


class _Handler(SimpleHTTPRequestHandler):
    """The built site, plus search.html with the probe added (as search-probe.html: same folder,
    same scripts and index); nothing is written into _build."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, directory=str(SITE), **kwargs)

    def do_GET(self):
        if urlsplit(self.path).path != "/" + PROBE_PAGE:
            return super().do_GET()
        cases = json.dumps([{"q": c["q"], "doc": c["doc"]} for c in queries()], ensure_ascii=False)
        page = (SITE / "search.html").read_text(encoding="utf-8")
        body = page.replace("</body>", PROBE % cases.replace("</", "<\\/") + "</body>").encode("utf-8")
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def chromium_dom(url: str, user_dir: Path) -> str:
    # Nothing but this machine: the site must not need the network (loopback bypasses the proxy).
    dom = run_chromium(url, user_dir, budget_ms=30000).stdout
    assert "</html>" in dom, "Chromium did not return the page"
    return dom


@pytest.fixture(scope="module")
def results(server, tmp_path_factory) -> list[dict]:
    dom = chromium_dom(f"{server}/{PROBE_PAGE}", tmp_path_factory.mktemp("chromium"))
    found = re.search(r'<pre id="search-probe"[^>]*>(.*?)</pre>', dom, flags=re.S)
    assert found, "the search probe did not report (did the search index load?)"
    data = json.loads(html.unescape(found.group(1)))
    assert not isinstance(data, dict), f"the search probe failed: {data}"
    return data


def _failures(results: list[dict], kinds: set[str]) -> list[str]:
    expected = {(c["q"], c["doc"]): c["kind"] for c in queries()}
    return [
        f"{r['q']!r} (terms {r['terms']}) -> {r['found'][:4] or 'nothing'}, not {r['doc']}"
        for r in results
        if expected[r["q"], r["doc"]] in kinds and r["doc"] not in r["found"]
    ]


def test_every_also_asked_phrasing_finds_its_chapter(results):
    """梯度消失 finds "Why does saturation kill the gradient?", and so on for every phrasing, in
    both languages, of the question index's "Also asked as · 常见问法" column."""
    chinese = _failures(results, {"also asked (中文)"})
    english = _failures(results, {"also asked"})
    total = sum(1 for c in queries() if c["kind"].startswith("also asked"))
    assert not chinese + english, f"{len(chinese + english)} of {total} phrasings miss their chapter:\n" + "\n".join(
        chinese + english
    )


def test_every_chapters_key_terms_find_it(results):
    """A chapter's title, its 中文 question and its cheat-sheet question, typed as they are, find
    the chapter."""
    missed = _failures(results, {"key terms"})
    total = sum(1 for c in queries() if c["kind"] == "key terms")
    assert not missed, f"{len(missed)} of {total} key-term queries miss their chapter:\n" + "\n".join(missed)


def test_results_have_a_snippet_over_http(results):
    """Over http the result shows a snippet of the chapter with a word of the query in it (over
    file:// the browser blocks the page fetch and no result has one)."""
    bad = []
    for r in results:
        if r["doc"] not in r["found"]:
            continue  # reported by the tests above
        snippet = (r["snippet"] or "").lower()
        if not any(t in snippet for t in r["terms"]):
            bad.append(f"{r['q']!r} -> {r['doc']}: {r['snippet']!r}")
    assert not bad, f"{len(bad)} results without a snippet showing the query:\n" + "\n".join(bad)


def test_search_page_itself_shows_the_chapter(server, tmp_path):
    """The unmodified search page, opened as a reader does (search.html?q=…), lists the chapter
    with a snippet: the whole path through the page's own scripts, for one Chinese phrasing."""
    case = next(c for c in queries() if c["kind"] == "also asked (中文)")
    dom = chromium_dom(f"{server}/search.html?q={quote(case['q'])}", tmp_path)
    items = re.findall(r"<li>(.*?)</li>", dom.split('id="search-results"', 1)[-1], flags=re.S)
    mine = [li for li in items if f'href="{case["doc"]}.html' in li]
    assert mine, f"search.html?q={case['q']} does not list {case['doc']} ({len(items)} results)"
    assert 'class="context"' in mine[0], f"the result for {case['doc']} has no snippet"
