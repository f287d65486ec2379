"""Finishing touches to the book's two outputs.

Both:

* Code cells are shown without their glue calls (:func:`without_glue_calls`): the statements that
  only put a computed number into the prose are for the notebook, not for the reader, and were
  about 500 lines of the site's code. A comment line says how many are not shown.

Website:

* A figure's image gets the figure's caption as its alt text (myst-nb names output images by a
  hash, which a screen reader would read out).

PDF (LaTeX build only):

* Results are numbered as on the website (chapter.number), see :func:`number_results_by_chapter`.
* A proof (sphinx-proof's ``{prf:proof}``) becomes amsthm's ``proof`` environment: the heading
  "Proof." and a closing ∎, instead of an admonition box with an empty title bar.
* A chapter's "References" section is dropped when nothing in it prints: in the PDF its
  footnote citations already sit at the foot of the pages that cite them.
"""

from __future__ import annotations

import ast
import re

from docutils import nodes
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx_proof.nodes import proof_node

BOOK_SECNUM_DEPTH = 1  # as numfig_secnum_depth in _config.yml
HASHLIKE = re.compile(r"[0-9a-f]{16,}|.*\.(png|svg|jpe?g)")
PROOF_PREFIX = "Proof. "  # added by sphinx-proof to the first paragraph; amsthm prints its own


class LatexProofs(SphinxPostTransform):
    default_priority = 900
    formats = ("latex",)

    def run(self, **kwargs) -> None:
        for node in list(self.document.findall(proof_node)):
            body = node[0] if node.children and isinstance(node[0], nodes.admonition) else node
            first = next(iter(body.findall(nodes.paragraph)), None)
            if first is not None and first.children and isinstance(first[0], nodes.Text):
                text = first[0].astext()
                if text.startswith(PROOF_PREFIX):
                    first.replace(first[0], nodes.Text(text[len(PROOF_PREFIX) :]))
            node.replace_self(
                [
                    nodes.raw("", "\n\\begin{proof}\n", format="latex"),
                    *body.children,
                    nodes.raw("", "\n\\end{proof}\n", format="latex"),
                ]
            )


def _prints_nothing(node: nodes.Node) -> bool:
    if isinstance(node, (nodes.title, nodes.target, nodes.footnote, nodes.comment)):
        return True
    if isinstance(node, nodes.Element) and not node.astext().strip():
        return True
    return isinstance(node, nodes.Element) and all(_prints_nothing(c) for c in node.children) and bool(node.children)


class DropEmptyReferences(SphinxPostTransform):
    default_priority = 900
    formats = ("latex",)

    def run(self, **kwargs) -> None:
        for section in list(self.document.findall(nodes.section)):
            title = section.next_node(nodes.title)
            if title is None or title.astext().strip() != "References":
                continue
            if all(_prints_nothing(child) for child in section.children):
                section.parent.remove(section)


class CaptionsAsAltText(SphinxPostTransform):
    default_priority = 900
    formats = ("html",)

    def run(self, **kwargs) -> None:
        for figure in self.document.findall(nodes.figure):
            caption = figure.next_node(nodes.caption)
            if caption is None:
                continue
            text = " ".join(caption.astext().split())
            for image in figure.findall(nodes.image):
                alt = image.get("alt", "")
                if not alt or HASHLIKE.fullmatch(alt) or alt == image.get("uri", ""):
                    image["alt"] = text


GLUE_FUNCTIONS = {"glue", "glue_text", "glue_number"}


def _is_glue_statement(statement: ast.stmt) -> bool:
    """``glue_text(…)``, ``_ = glue_number(…)``, or a loop whose body only glues."""
    if isinstance(statement, ast.For):
        return all(_is_glue_statement(s) for s in statement.body) and not statement.orelse
    if isinstance(statement, ast.Assign):
        if not all(isinstance(t, ast.Name) and t.id == "_" for t in statement.targets):
            return False
    elif not isinstance(statement, ast.Expr):
        return False
    call = statement.value
    if not isinstance(call, ast.Call):
        return False
    name = getattr(call.func, "id", None) or getattr(call.func, "attr", None)
    return name in GLUE_FUNCTIONS


def without_glue_calls(source: str) -> str:
    """``source`` without its top-level glue statements, and one comment line where the first one
    was; unchanged when it has none (or does not parse)."""
    try:
        statements = ast.parse(source).body
    except SyntaxError:
        return source
    glued = [s for s in statements if _is_glue_statement(s)]
    if not glued:
        return source
    lines = source.split("\n")
    drop = {i for s in glued for i in range(s.lineno - 1, s.end_lineno)}
    note = f"# (not shown: {len(glued)} glue call{'s' if len(glued) > 1 else ''} that put numbers into the text)"
    kept = []
    for i, line in enumerate(lines):
        if i == glued[0].lineno - 1:
            kept.append(note)
        if i not in drop:
            kept.append(line)
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).strip("\n")
    return "" if text == note else text


class HideGlueCalls(SphinxPostTransform):
    default_priority = 900

    def run(self, **kwargs) -> None:
        for cell in list(self.document.findall(nodes.container)):
            if cell.get("nb_element") != "cell_code_source":
                continue
            block = cell.next_node(nodes.literal_block)
            if block is None:
                continue
            shown = without_glue_calls(block.astext())
            if not shown:
                cell.parent.remove(cell)
            elif shown != block.astext():
                block.children = []
                block += nodes.Text(shown)
                block.rawsource = shown  # Sphinx highlights a block only when rawsource matches its text


def _is_latex(app) -> bool:
    from sphinx.builders.latex import LaTeXBuilder

    return isinstance(app.builder, LaTeXBuilder)


def number_results_by_chapter(app, env) -> None:
    """sphinx-jupyterbook-latex raises ``numfig_secnum_depth`` to 2 for a book with parts: LaTeX's
    own counters (equations, figures) need it, one level down from the parts, but Sphinx also
    uses it for the numbers it assigns itself (proofs, exercises), which then count per section
    ("Proposition 3.4.1") where the website counts per chapter ("Proposition 3.5"). Those numbers
    are assigned with the website's depth; LaTeX's setting is restored before writing."""
    if _is_latex(app):
        env.book_latex_secnum_depth = app.config["numfig_secnum_depth"]
        app.config["numfig_secnum_depth"] = BOOK_SECNUM_DEPTH


def restore_latex_depth(app, env) -> None:
    if _is_latex(app) and hasattr(env, "book_latex_secnum_depth"):
        app.config["numfig_secnum_depth"] = env.book_latex_secnum_depth


def setup(app):
    app.connect("env-updated", number_results_by_chapter)  # before Sphinx numbers them (env-get-updated)
    app.connect("env-check-consistency", restore_latex_depth)  # after, and before LaTeX is written
    app.add_post_transform(CaptionsAsAltText)
    app.add_post_transform(HideGlueCalls)
    app.add_post_transform(LatexProofs)
    app.add_post_transform(DropEmptyReferences)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
