"""The training harness of chapters 4–9: seeded toy tasks (:mod:`.tasks`), three sequence layers
with their multiply-add counts (:mod:`.layers`) and small attention models trained with autograd,
vectorised over seeds (:mod:`.training`: one loop, one Adam, one SGD, one score registry).

Chapters use it as ``from attn_utils import harness as hz``: ``hz.train``, ``hz.recall_task`` …
Every public name of the three modules (their ``__all__``) is available here.
"""

from . import layers, tasks, training
from .layers import *  # noqa: F403
from .tasks import *  # noqa: F403
from .training import *  # noqa: F403

__all__ = [*layers.__all__, *tasks.__all__, *training.__all__]
