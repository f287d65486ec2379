"""Finishing touches to the book's two outputs.

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
    app.add_post_transform(LatexProofs)
    app.add_post_transform(DropEmptyReferences)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
