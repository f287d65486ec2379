"""attn_utils — the numpy package shared by every chapter of *Attention, Derived*.

The package is laid out in layers; each imports only from the layers below it::

    attn_utils/
      validation.py        argument checks with messages that name the argument (the bottom layer)
      softmax.py           softmax, log-softmax, entropy, the softmax Jacobian      ┐ the core: read
      attention.py         scaled dot-product attention, masks, the query Jacobian   │ these first; each
      multihead.py         split/merge heads, MHAParams, multi-head and grouped-query ┘ sits next to its formula
      book/                what the pages need: checks, plotting, glue, measuring (costs, time, memory)
      harness/             toy tasks, three sequence layers, the training loop (one loop, one Adam)
      experiments/         one module per chapter that needs one: ch02_saturation … ch12_blocked

Dependencies point one way: experiments → harness → book → core → validation (an experiment
module may also use an earlier chapter's module). Importing has no side effects, and
``import attn_utils`` does not import matplotlib (plotting imports it on the first figure).

The top level holds the names every chapter uses; the rest is reached through its room, e.g.
``from attn_utils import harness as hz`` or
``from attn_utils.experiments import ch06_bottleneck as ex``.
Costs are counted in multiply-adds (MACs) throughout; 1 MAC = 2 FLOPs.
"""

from . import book, harness
from .attention import (
    attention_query_jacobian,
    attention_scores,
    causal_mask,
    default_scale,
    scaled_dot_product_attention,
)
from .book.checks import (
    MonteCarloMoments,
    SeedSummary,
    check,
    check_allclose,
    check_bound,
    check_count,
    check_seeds,
    mc_moments,
    measured,
)
from .book.glue import glue_number, glue_text
from .book.measuring import (
    count_macs,
    loglog_slope,
    min_seconds,
    numerical_jacobian,
    running_mean,
    traced_peak_memory,
    use_single_thread_blas,
)
from .book.plotting import PALETTE, attention_heatmap, figure, use_book_style
from .book.seeding import rng, seed, seed_base, seeds
from .multihead import (
    MHAParams,
    attention_heads,
    grouped_attention,
    init_mha_params,
    merge_heads,
    mha_param_count,
    multi_head_attention,
    split_heads,
)
from .softmax import (
    entropy,
    jacobian_frobenius_sq,
    log_softmax,
    log_tail_mass,
    softmax,
    softmax_core,
    softmax_jacobian,
)

__all__ = [
    "book",
    "harness",
    # core
    "softmax",
    "softmax_core",
    "log_softmax",
    "log_tail_mass",
    "entropy",
    "softmax_jacobian",
    "jacobian_frobenius_sq",
    "attention_scores",
    "scaled_dot_product_attention",
    "attention_query_jacobian",
    "causal_mask",
    "default_scale",
    "split_heads",
    "merge_heads",
    "MHAParams",
    "init_mha_params",
    "mha_param_count",
    "multi_head_attention",
    "attention_heads",
    "grouped_attention",
    # book: checks, glue, plotting, measuring
    "check",
    "check_allclose",
    "check_bound",
    "check_count",
    "check_seeds",
    "measured",
    "SeedSummary",
    "mc_moments",
    "MonteCarloMoments",
    "glue_number",
    "glue_text",
    "seed_base",
    "seed",
    "seeds",
    "rng",
    "PALETTE",
    "figure",
    "use_book_style",
    "attention_heatmap",
    "count_macs",
    "use_single_thread_blas",
    "min_seconds",
    "loglog_slope",
    "running_mean",
    "numerical_jacobian",
    "traced_peak_memory",
]
__version__ = "0.2.0"
