"""What the pages need around the core: one-line verdict checks (:mod:`.checks`), the book's
figure style (:mod:`.plotting`, matplotlib imported on first use), numbers glued into the prose
(:mod:`.glue`), the seed base every random draw derives from (:mod:`.seeding`, ``ATTN_SEED``)
and measuring instruments (:mod:`.measuring`: multiply-add counts, time, memory, fitted slopes,
finite differences, BLAS threads). The common names are re-exported by
:mod:`attn_utils`."""

from . import checks, glue, measuring, plotting, seeding

__all__ = ["checks", "glue", "measuring", "plotting", "seeding"]
