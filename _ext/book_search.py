"""The website's search finds a chapter by the words readers type for its question, Chinese or English.

With ``html_search_language: zh`` Sphinx indexes Chinese as the words jieba cuts it into, but the
browser splits a query only at spaces and punctuation, so 梯度消失 stays one term while the index
holds 梯度 and 消失: nothing is found. And English words were stemmed by one algorithm in the
index (snowball "english") and by another in the browser (Porter): "why" became "whi" in the
index and stayed "why" in the query. What this extension does:

* Each chapter page shows, under its Chinese question, the other ways readers ask it: its row of
  the question index's "Also asked as · 常见问法" column (intro.md, the one source), so those words
  are indexed with the chapter and its result snippet shows them.
* The chapters' own Chinese phrasings (the Chinese runs of that column and of each chapter's 中文
  question) are indexed as terms wherever they occur in a page, whatever jieba's cut around them
  was; jieba alone would index 梯度消失 only as 梯度 and 消失, and a word inside one of its longer
  words not at all. Only phrasings a chapter page shows: the browser searches a query that is one
  of them as that one term, so it must be in the chapter. (This replaces a jieba user
  dictionary, the ``dict`` search option, which still works: jieba's search mode re-emits only the
  two- and three-character words inside a dictionary word, so a long user word would hide the
  longer words inside it.)
* In the browser, each run of Chinese characters in a query is cut into terms of the index itself,
  covering as many characters as possible with as few pieces as possible; a character no term
  covers is dropped, as the index drops single characters (and single letters). So 梯度消失 is
  searched as that term, 为什么需要多头 as 为什么, 需要, 多头.
* English words are stemmed with the Porter algorithm on both sides, as Sphinx's English search does.
"""

from __future__ import annotations

import re
import unicodedata

import snowballstemmer
from docutils import nodes
from sphinx import addnodes
from sphinx.search.zh import SearchChinese
from sphinx.transforms.post_transforms import SphinxPostTransform

QUESTION_INDEX = "intro"
ALSO_ASKED = "Also asked as · 常见问法"
CHINESE_QUESTION = re.compile(r"^中文：(.+)$", re.S)
HAN_RUN = re.compile(r"[\u3400-\u9fff]{2,}")

# The book's Chinese phrasings, collected once every page is read (env-updated); the indexer is
# created afterwards, when writing starts.
_BOOK_PHRASES: set[str] = set()

# Defines splitQuery, which searchtools.js uses in place of its own (language_data.js is loaded
# after it). Search.query runs only once the index has loaded, so the index's terms are there.
SPLITTER_JS = r"""
/* A query's Chinese runs are cut into the index's own terms (_ext/book_search.py). */
var splitQuery = (query) => {
  const han = /\p{Script=Han}/u;
  const index = typeof Search !== "undefined" ? Search._index : null;
  if (index && !splitQuery.words) {
    splitQuery.words = new Set(
      [...Object.keys(index.terms), ...Object.keys(index.titleterms)].filter((w) => w.length > 1 && han.test(w))
    );
    splitQuery.longest = Math.max(2, ...[...splitQuery.words].map((w) => w.length));
  }
  const words = splitQuery.words || new Set();
  const longest = splitQuery.longest || 2;
  const cut = (run) => {
    // best[i] for run[0, i): [characters covered, pieces, start of its last piece or -1 (dropped)]
    const best = [[0, 0, -1]];
    for (let i = 1; i <= run.length; i++) {
      best[i] = [best[i - 1][0], best[i - 1][1], -1];
      for (let j = Math.max(0, i - longest); j < i - 1; j++) {
        if (!words.has(run.slice(j, i))) continue;
        const covered = best[j][0] + i - j;
        const pieces = best[j][1] + 1;
        if (covered > best[i][0] || (covered === best[i][0] && pieces < best[i][1])) best[i] = [covered, pieces, j];
      }
    }
    const out = [];
    for (let i = run.length; i > 0; ) {
      const j = best[i][2];
      if (j < 0) i -= 1;
      else {
        out.unshift(run.slice(j, i));
        i = j;
      }
    }
    return out;
  };
  // NFKC, as the index does (BookChinese.split): a title's "dₖ" (U+2096) is the word "dk".
  return query
    .normalize("NFKC")
    .split(/[^\p{Letter}\p{Number}_\p{Emoji_Presentation}]+/gu)
    .flatMap((token) => token.match(/\p{Script=Han}+|\P{Script=Han}+/gu) || [])
    .flatMap((part) => (han.test(part) ? cut(part) : [part]))
    .filter((term) => term.length > 1);
};
"""


class BookChinese(SearchChinese):
    """Sphinx's Chinese search with the book's phrasings as terms, Porter stemming and the splitter above."""

    js_splitter_code = SPLITTER_JS

    def init(self, options: dict[str, str]) -> None:
        super().init(options)
        # The browser stems with the Porter stemmer (js_porter_stemmer); so must the index.
        self.stemmer = snowballstemmer.stemmer("porter")
        self.phrases = sorted(_BOOK_PHRASES)

    def split(self, input: str) -> list[str]:
        # NFKC on both sides (the browser's splitter too): a title's "dₖ" (U+2096) is the word "dk".
        input = unicodedata.normalize("NFKC", input)
        return super().split(input) + [p for p in self.phrases if p in input]


def _rendered_rows(env) -> list[tuple[str, dict[str, str]]]:
    """The question index's rows: (chapter label, {column heading: cell text as rendered})."""
    if QUESTION_INDEX not in env.all_docs:
        return []
    rows = []
    for table in env.get_doctree(QUESTION_INDEX).findall(nodes.table):
        head = next(iter(table.findall(nodes.thead)), None)
        if head is None or ALSO_ASKED not in head.astext():
            continue
        headings = [e.astext().strip() for e in head.findall(nodes.entry)]
        for row in table.findall(nodes.row):
            refs = list(row.findall(addnodes.pending_xref))
            if row.parent.tagname == "tbody" and refs:
                rows.append((refs[0]["reftarget"], dict(zip(headings, (e.astext().strip() for e in row)))))
    return rows


def collect(app, env) -> list[str]:
    """The question index's phrasings and the chapters' Chinese phrasings; when they changed, every
    page is written again (the chapters show the phrasings, and every page is indexed with them)."""
    also_asked = {label: cells[ALSO_ASKED] for label, cells in _rendered_rows(env)}
    phrases = set()
    for text in also_asked.values():
        phrases.update(HAN_RUN.findall(text))
    labels = env.get_domain("std").labels
    for docname in sorted({labels[label][0] for label in also_asked if label in labels}):
        for para in env.get_doctree(docname).findall(nodes.paragraph):
            found = CHINESE_QUESTION.match(para.astext())
            if found:
                phrases.update(HAN_RUN.findall(found.group(1)))
                break
    changed = (also_asked, phrases) != (getattr(env, "book_also_asked", None), getattr(env, "book_phrases", None))
    env.book_also_asked, env.book_phrases = also_asked, phrases
    _BOOK_PHRASES.clear()
    _BOOK_PHRASES.update(phrases)
    return sorted(env.found_docs) if changed else []


class AlsoAskedUnderTheQuestion(SphinxPostTransform):
    """On a chapter page, the question index's other phrasings, right under the Chinese question."""

    default_priority = 800
    formats = ("html",)

    def run(self, **kwargs) -> None:
        labels = self.env.get_domain("std").labels
        mine = [
            text
            for label, text in getattr(self.env, "book_also_asked", {}).items()
            if labels.get(label, ("",))[0] == self.env.docname
        ]
        section = next(iter(self.document.findall(nodes.section)), None)
        if not mine or section is None:
            return
        line = nodes.paragraph("", "", classes=["also-asked"])
        line += nodes.strong(text=ALSO_ASKED + "：")
        line += nodes.Text(" " + mine[0])
        chinese = next((p for p in section.findall(nodes.paragraph) if CHINESE_QUESTION.match(p.astext())), None)
        if chinese is not None:
            chinese.parent.insert(chinese.parent.index(chinese) + 1, line)
        else:
            section.insert(1, line)


def setup(app):
    app.add_search_language(BookChinese)
    app.connect("env-updated", collect)
    app.add_post_transform(AlsoAskedUnderTheQuestion)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
