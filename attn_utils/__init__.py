"""attn_utils — the small numpy package shared by every chapter of *Attention, Derived*.

Modules are named for what they hold:

* :mod:`attn_utils.softmax` — softmax, log-softmax, entropy, the softmax Jacobian
* :mod:`attn_utils.attention` — scaled dot-product attention, masks, the query Jacobian
* :mod:`attn_utils.multihead` — split/merge heads, projections, multi-head attention
* :mod:`attn_utils.checks` — assertions that print one verdict line; Monte Carlo moments
* :mod:`attn_utils.plotting` — the book's figure style and an attention heatmap
* :mod:`attn_utils.book` — glue computed numbers into the prose
* :mod:`attn_utils.gradients` — finite-difference Jacobians; the softmax Jacobian accurate near one-hot
"""
from .attention import (attention_query_jacobian, attention_scores, causal_mask, default_scale,
                        scaled_dot_product_attention)
from .checks import MonteCarloMoments, check, check_allclose, check_bound, mc_moments
from .multihead import init_mha_params, merge_heads, mha_param_count, multi_head_attention, split_heads
from .plotting import PALETTE, attention_heatmap, figure, use_book_style
from .softmax import entropy, jacobian_frobenius_sq, log_softmax, softmax, softmax_core, softmax_jacobian

__all__ = [
    "attention_query_jacobian", "attention_scores", "causal_mask", "default_scale",
    "scaled_dot_product_attention", "MonteCarloMoments", "check", "check_allclose", "check_bound",
    "mc_moments", "init_mha_params", "merge_heads", "mha_param_count", "multi_head_attention",
    "split_heads", "entropy", "jacobian_frobenius_sq", "log_softmax", "softmax", "softmax_core",
    "softmax_jacobian", "PALETTE", "attention_heatmap", "figure", "use_book_style",
]
from .gradients import numerical_jacobian, softmax_jacobian_from_logits  # noqa: E402  (chapter 3)
__all__ += ["numerical_jacobian", "softmax_jacobian_from_logits"]
__version__ = "0.1.0"
from .blocked import BlockedAttentionStats, blocked_attention, traced_peak_memory  # noqa: E402  (chapter 12)
__all__ += ["BlockedAttentionStats", "blocked_attention", "traced_peak_memory"]
from .saturation import first_exact_one, log_tail_mass  # noqa: E402  (chapter 2)
__all__ += ["first_exact_one", "log_tail_mass"]
from .decoding import (FLOP_PARTS, DecoderParams, KVCache, decoder_extend, decoder_forward,  # noqa: E402  (chapter 10)
                       decoding_flops, greedy_generate, init_decoder_params, kv_cache_values)
__all__ += ["FLOP_PARTS", "DecoderParams", "KVCache", "decoder_extend", "decoder_forward", "decoding_flops",
            "greedy_generate", "init_decoder_params", "kv_cache_values"]
from .layers import (LayerGraph, MacCounter, attention_input_jacobians, attention_macs, conv1d_layer,  # noqa: E402
                     conv_macs, count_macs, hop_distances, init_conv_params, init_rnn_params,
                     layer_graph, layers_to_connect, loglog_slope, min_seconds, perturbation_reach,
                     rnn_input_jacobians, rnn_layer, rnn_macs, self_attention_layer, sequential_depth)

__all__ += [
    "LayerGraph", "MacCounter", "attention_input_jacobians", "attention_macs", "conv1d_layer", "conv_macs",
    "count_macs", "hop_distances", "init_conv_params", "init_rnn_params", "layer_graph",
    "layers_to_connect", "loglog_slope", "min_seconds", "perturbation_reach", "rnn_input_jacobians", "rnn_layer",
    "rnn_macs", "self_attention_layer", "sequential_depth",
]

# Training harness for chapters 4–9 (toy tasks + small autograd models, vectorised over seeds)
from .tasks import (IGNORE, Task, TaskBatch, copy_task, keyword_task, previous_token_task,  # noqa: E402
                    recall_task, two_relation_task)
from .training import (SCORES, ModelConfig, ScoreSpec, TrainResult, attention_weights,  # noqa: E402
                       evaluate, forward, init_params, loss, register_score, train)

__all__ += [
    "IGNORE", "Task", "TaskBatch", "copy_task", "keyword_task", "previous_token_task", "recall_task",
    "two_relation_task", "SCORES", "ModelConfig", "ScoreSpec", "TrainResult", "attention_weights",
    "evaluate", "forward", "init_params", "loss", "register_score", "train",
]
from .qknorm import (cosine_logits, cosine_max_weight, cosine_score, fold_query_scale,  # noqa: E402  (chapter 5)
                     gain_for_max_weight, register_cosine_score, train_per_parameter)
__all__ += ["cosine_logits", "cosine_max_weight", "cosine_score", "fold_query_scale", "gain_for_max_weight",
            "register_cosine_score", "train_per_parameter"]
from .bilinear import (SELF_PENALTY, argmax_offset_rate, cyclic_previous_token_task,  # noqa: E402  (chapter 8)
                       diagonal_max_probability, dot_score_no_self, factorization_rank, first_layer_queries,
                       qk_attention_layer, qk_scores, self_mask)
__all__ += ["SELF_PENALTY", "argmax_offset_rate", "cyclic_previous_token_task", "diagonal_max_probability",
            "dot_score_no_self", "factorization_rank", "first_layer_queries", "qk_attention_layer", "qk_scores",
            "self_mask"]
from .heads import (PatternFit, PruningCurve, fit_attention_pattern, greedy_head_pruning,  # noqa: E402  (chapter 9)
                    head_contributions, log_ratio_matrix, logit_factors, mha_macs, min_head_dim)
__all__ += ["PatternFit", "PruningCurve", "fit_attention_pattern", "greedy_head_pruning", "head_contributions",
            "log_ratio_matrix", "logit_factors", "mha_macs", "min_head_dim"]
from .scaling import ScaleSweep, query_key_vectors, running_mean, scale_exponent_sweep  # noqa: E402  (chapter 4)
__all__ += ["ScaleSweep", "query_key_vectors", "running_mean", "scale_exponent_sweep"]
