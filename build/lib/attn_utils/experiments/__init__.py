"""One module per chapter that needs code of its own, named ``chNN_topic``. Each is imported by its
chapter (``from attn_utils.experiments import ch06_bottleneck as ex``) and shown there next to the
evidence it produces. A module uses the core, the book helpers, the harness, and at most an earlier
chapter's module; nothing here is imported by ``import attn_utils``."""
