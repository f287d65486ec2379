"""The training harness of chapters 4–9: seeded toy tasks (:mod:`.tasks`), three sequence layers
with their multiply-add counts (:mod:`.layers`) and small attention models trained with autograd,
vectorised over seeds (:mod:`.training`: one loop, one Adam, one SGD, one score registry).

Chapters use it as ``from attn_utils import harness as hz``: ``hz.train``, ``hz.recall_task`` …
"""

from .layers import (
    attention_macs,
    conv1d_layer,
    conv_macs,
    init_conv_params,
    init_rnn_params,
    rnn_layer,
    rnn_macs,
    self_attention_layer,
)
from .tasks import IGNORE, Task, TaskBatch, copy_task, keyword_task, previous_token_task, recall_task, two_relation_task
from .training import (
    SCORES,
    ModelConfig,
    ScoreSpec,
    TrainResult,
    adam,
    attention_weights,
    evaluate,
    forward,
    init_params,
    loss,
    per_seed_loss,
    query_key_vectors,
    register_score,
    sgd,
    train,
)

__all__ = [
    "IGNORE",
    "Task",
    "TaskBatch",
    "copy_task",
    "keyword_task",
    "previous_token_task",
    "recall_task",
    "two_relation_task",
    "attention_macs",
    "rnn_macs",
    "conv_macs",
    "self_attention_layer",
    "init_rnn_params",
    "rnn_layer",
    "init_conv_params",
    "conv1d_layer",
    "SCORES",
    "ScoreSpec",
    "register_score",
    "ModelConfig",
    "TrainResult",
    "init_params",
    "forward",
    "attention_weights",
    "evaluate",
    "loss",
    "per_seed_loss",
    "query_key_vectors",
    "adam",
    "sgd",
    "train",
]
