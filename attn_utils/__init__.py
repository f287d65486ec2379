"""attn_utils — the numpy package shared by every chapter of *Attention, Derived*.

Modules are named for what they hold; every public name is also available as ``au.name``.

Core: every chapter:

* :mod:`attn_utils.softmax` — softmax, log-softmax, entropy, the softmax Jacobian
* :mod:`attn_utils.attention` — scaled dot-product attention, masks, the query Jacobian
* :mod:`attn_utils.multihead` — split/merge heads, projections, multi-head attention
* :mod:`attn_utils.checks` — assertions that print one verdict line; Monte Carlo moments
* :mod:`attn_utils.plotting` — the book's figure style and an attention heatmap

Training harness: chapters 4–9:

* :mod:`attn_utils.tasks` — seeded toy tasks (recall, copy, previous token, keyword, two relations)
* :mod:`attn_utils.training` — small attention models trained with autograd, vectorised over seeds

Part I: why divide by √d_k:

* :mod:`attn_utils.saturation` — where softmax saturates and where float64 rounds to exactly 1 (ch. 2)
* :mod:`attn_utils.gradients` — finite-difference Jacobians; the softmax Jacobian accurate near one-hot (ch. 3)
* :mod:`attn_utils.scaling` — the scale-exponent sweep; layer-0 queries and keys of trained models (ch. 4)
* :mod:`attn_utils.qknorm` — folding the scale into W_Q; cosine attention and QK-norm (ch. 5)

Part II: designing attention:

* :mod:`attn_utils.bottleneck` — the fixed-length bottleneck and the keyword classifier (ch. 6)
* :mod:`attn_utils.scores` — score functions and their counted costs (ch. 7)
* :mod:`attn_utils.bilinear` — shared vs separate W_Q/W_K, symmetric scores (ch. 8)
* :mod:`attn_utils.heads` — head costs, reachable attention patterns, head pruning (ch. 9)

Part III: Transformers as systems:

* :mod:`attn_utils.decoding` — a small decoder, KV cache, greedy generation (ch. 10)
* :mod:`attn_utils.layers` — self-attention, RNN and CNN layers; counted cost and path length (ch. 11)
* :mod:`attn_utils.blocked` — blocked attention with an online softmax (ch. 12)

Argument checks live in :mod:`attn_utils.validation`; glue helpers in :mod:`attn_utils.book`.
Importing :mod:`attn_utils.scores` registers the chapter-7 score functions with the harness.
"""

from .attention import (
    attention_query_jacobian,
    attention_scores,
    causal_mask,
    default_scale,
    scaled_dot_product_attention,
)
from .bilinear import (
    SELF_PENALTY,
    argmax_offset_rate,
    cyclic_previous_token_task,
    diagonal_max_probability,
    dot_score_no_self,
    factorization_rank,
    first_layer_queries,
    qk_attention_layer,
    qk_scores,
    self_mask,
)
from .blocked import BlockedAttentionStats, blocked_attention, traced_peak_memory
from .bottleneck import (
    CLS_WORD,
    KEYWORD_FILLERS,
    KEYWORD_NEGATIVE,
    KEYWORD_POSITIVE,
    bag_accuracy_bound,
    fano_bits,
    ids_to_words,
    keyword_attention_mass,
    keyword_vocabulary,
    pack_tokens,
    superposition_copy_accuracy,
    tokens_per_coordinate,
    unpack_tokens,
    with_uniform_attention,
    words_to_ids,
)
from .checks import (
    MonteCarloMoments,
    SeedSummary,
    check,
    check_allclose,
    check_bound,
    check_count,
    check_seeds,
    mc_moments,
)
from .decoding import (
    FLOP_PARTS,
    DecoderParams,
    KVCache,
    decoder_extend,
    decoder_forward,
    decoding_flops,
    greedy_generate,
    init_decoder_params,
    kv_cache_values,
)
from .gradients import numerical_jacobian, softmax_jacobian_from_logits
from .heads import (
    PatternFit,
    PruningCurve,
    fit_attention_pattern,
    greedy_head_pruning,
    head_contributions,
    log_ratio_matrix,
    logit_factors,
    mha_macs,
    min_head_dim,
)
from .layers import (
    LayerGraph,
    MacCounter,
    attention_input_jacobians,
    attention_macs,
    conv1d_layer,
    conv_macs,
    count_macs,
    hop_distances,
    init_conv_params,
    init_rnn_params,
    layer_graph,
    layers_to_connect,
    loglog_slope,
    min_seconds,
    perturbation_reach,
    rnn_input_jacobians,
    rnn_layer,
    rnn_macs,
    self_attention_layer,
    sequential_depth,
)
from .multihead import init_mha_params, merge_heads, mha_param_count, multi_head_attention, split_heads
from .plotting import PALETTE, attention_heatmap, figure, use_book_style
from .qknorm import (
    cosine_logits,
    cosine_max_weight,
    cosine_score,
    fold_query_scale,
    gain_for_max_weight,
    register_cosine_score,
    train_per_parameter,
)
from .saturation import first_exact_one, log_tail_mass
from .scaling import ScaleSweep, query_key_vectors, running_mean, scale_exponent_sweep
from .scores import (
    SCORE_NAMES,
    ScoreCost,
    init_score_params,
    linear_attention,
    sample_init_logits,
    score,
    score_cost,
    score_param_count,
    score_weights,
    weight_rule,
)
from .softmax import entropy, jacobian_frobenius_sq, log_softmax, softmax, softmax_core, softmax_jacobian
from .tasks import IGNORE, Task, TaskBatch, copy_task, keyword_task, previous_token_task, recall_task, two_relation_task
from .training import (
    SCORES,
    ModelConfig,
    ScoreSpec,
    TrainResult,
    attention_weights,
    evaluate,
    forward,
    init_params,
    loss,
    register_score,
    train,
)

__all__ = [
    "entropy",
    "jacobian_frobenius_sq",
    "log_softmax",
    "softmax",
    "softmax_core",
    "softmax_jacobian",
    "attention_query_jacobian",
    "attention_scores",
    "causal_mask",
    "default_scale",
    "scaled_dot_product_attention",
    "init_mha_params",
    "merge_heads",
    "mha_param_count",
    "multi_head_attention",
    "split_heads",
    "MonteCarloMoments",
    "SeedSummary",
    "check",
    "check_count",
    "check_seeds",
    "check_allclose",
    "check_bound",
    "mc_moments",
    "PALETTE",
    "attention_heatmap",
    "figure",
    "use_book_style",
    "IGNORE",
    "Task",
    "TaskBatch",
    "copy_task",
    "keyword_task",
    "previous_token_task",
    "recall_task",
    "two_relation_task",
    "SCORES",
    "ModelConfig",
    "ScoreSpec",
    "TrainResult",
    "attention_weights",
    "evaluate",
    "forward",
    "init_params",
    "loss",
    "register_score",
    "train",
    "first_exact_one",
    "log_tail_mass",
    "numerical_jacobian",
    "softmax_jacobian_from_logits",
    "ScaleSweep",
    "query_key_vectors",
    "running_mean",
    "scale_exponent_sweep",
    "cosine_logits",
    "cosine_max_weight",
    "cosine_score",
    "fold_query_scale",
    "gain_for_max_weight",
    "register_cosine_score",
    "train_per_parameter",
    "CLS_WORD",
    "KEYWORD_FILLERS",
    "KEYWORD_NEGATIVE",
    "KEYWORD_POSITIVE",
    "bag_accuracy_bound",
    "fano_bits",
    "ids_to_words",
    "keyword_attention_mass",
    "keyword_vocabulary",
    "pack_tokens",
    "superposition_copy_accuracy",
    "tokens_per_coordinate",
    "unpack_tokens",
    "with_uniform_attention",
    "words_to_ids",
    "SCORE_NAMES",
    "ScoreCost",
    "init_score_params",
    "linear_attention",
    "sample_init_logits",
    "score",
    "score_cost",
    "score_param_count",
    "score_weights",
    "weight_rule",
    "SELF_PENALTY",
    "argmax_offset_rate",
    "cyclic_previous_token_task",
    "diagonal_max_probability",
    "dot_score_no_self",
    "factorization_rank",
    "first_layer_queries",
    "qk_attention_layer",
    "qk_scores",
    "self_mask",
    "PatternFit",
    "PruningCurve",
    "fit_attention_pattern",
    "greedy_head_pruning",
    "head_contributions",
    "log_ratio_matrix",
    "logit_factors",
    "mha_macs",
    "min_head_dim",
    "FLOP_PARTS",
    "DecoderParams",
    "KVCache",
    "decoder_extend",
    "decoder_forward",
    "decoding_flops",
    "greedy_generate",
    "init_decoder_params",
    "kv_cache_values",
    "LayerGraph",
    "MacCounter",
    "attention_input_jacobians",
    "attention_macs",
    "conv1d_layer",
    "conv_macs",
    "count_macs",
    "hop_distances",
    "init_conv_params",
    "init_rnn_params",
    "layer_graph",
    "layers_to_connect",
    "loglog_slope",
    "min_seconds",
    "perturbation_reach",
    "rnn_input_jacobians",
    "rnn_layer",
    "rnn_macs",
    "self_attention_layer",
    "sequential_depth",
    "BlockedAttentionStats",
    "blocked_attention",
    "traced_peak_memory",
]
__version__ = "0.1.0"
