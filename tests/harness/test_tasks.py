"""Toy tasks: shapes, target correctness recomputed independently, determinism, argument errors."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_utils.harness.tasks import (
    IGNORE,
    Task,
    TaskBatch,
    copy_task,
    keyword_task,
    previous_token_task,
    recall_task,
    two_relation_task,
)

ALL_TASKS = [
    recall_task(),
    recall_task(3, 5, 4, layout="interleaved"),
    copy_task(),
    previous_token_task(),
    keyword_task(),
    two_relation_task(),
    two_relation_task(6, 3, "prev2"),
]


@pytest.mark.parametrize("task", ALL_TASKS, ids=lambda t: f"{t.name}-{t.seq_len}")
def test_shapes_ranges_and_ignore(task: Task):
    b = task.sample(0, 50)
    assert isinstance(b, TaskBatch)
    assert b.x.shape == (50, task.seq_len) and b.x.dtype == np.int64
    assert b.x.min() >= 0 and b.x.max() < task.vocab_size
    want = (50, task.seq_len) if task.per_position else (50,)
    assert b.y.shape == want and b.y.dtype == np.int64
    scored = b.y[b.y != IGNORE]
    assert scored.size > 0 and scored.min() >= 0 and scored.max() < task.n_classes
    if not task.per_position:
        assert (b.y != IGNORE).all()


@pytest.mark.parametrize("task", ALL_TASKS, ids=lambda t: f"{t.name}-{t.seq_len}")
def test_same_seed_same_batch(task: Task):
    a, b = task.sample(7, 20), task.sample(np.random.default_rng(7), 20)
    assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)
    c = task.sample(8, 20)
    assert not np.array_equal(a.x, c.x)


def test_recall_fused_targets():
    task = recall_task(n_pairs=4, n_keys=6, n_values=5)
    b = task.sample(1, 200)
    pairs = b.x[:, :-1] - 6
    keys, values = pairs // 5, pairs % 5
    assert (np.sort(keys, axis=1)[:, 1:] != np.sort(keys, axis=1)[:, :-1]).all(), "keys must be distinct"
    hit = keys == b.x[:, -1:]
    assert (hit.sum(axis=1) == 1).all()
    assert np.array_equal(values[hit], b.y)
    assert np.array_equal(np.argmax(hit, axis=1), b.info["query_pos"])


def test_recall_interleaved_targets():
    task = recall_task(n_pairs=3, n_keys=5, n_values=4, layout="interleaved")
    b = task.sample(2, 200)
    keys, values = b.x[:, 0:-1:2], b.x[:, 1:-1:2] - 5
    hit = keys == b.x[:, -1:]
    assert (hit.sum(axis=1) == 1).all() and np.array_equal(values[hit], b.y)
    assert np.array_equal(2 * np.argmax(hit, axis=1), b.info["query_pos"])
    assert task.seq_len == 7 and task.vocab_size == 9


def test_copy_targets():
    task = copy_task(length=5, vocab=6)
    b = task.sample(3, 30)
    assert (b.x[:, 5] == 6).all() and (b.x[:, 6:] == 7).all()
    assert (b.y[:, :6] == IGNORE).all() and np.array_equal(b.y[:, 6:], b.x[:, :5])


def test_previous_token_targets():
    b = previous_token_task(n=7, vocab=5).sample(4, 30)
    assert (b.y[:, 0] == IGNORE).all() and np.array_equal(b.y[:, 1:], b.x[:, :-1])


def test_keyword_targets_and_positions():
    task = keyword_task(n=9, n_filler=10, n_keywords=3)
    b = task.sample(5, 300)
    assert (b.x[:, -1] == 16).all(), "CLS last"
    is_kw = (b.x >= 10) & (b.x < 16)
    assert (is_kw.sum(axis=1) == 1).all()
    assert np.array_equal(np.argmax(is_kw, axis=1), b.info["keyword_pos"])
    word = b.x[np.arange(300), b.info["keyword_pos"]]
    assert np.array_equal(b.y, (word < 13).astype(int))
    assert 0.35 < b.y.mean() < 0.65


@pytest.mark.parametrize("other", ["first", "prev2"])
def test_two_relation_targets(other):
    v = 5
    b = two_relation_task(n=8, vocab=v, other=other).sample(6, 40)
    assert (b.y[:, :2] == IGNORE).all()
    for i in range(2, 8):  # a loop over positions is fine in a test: it states the definition
        other_tok = b.x[:, i - 2] if other == "prev2" else b.x[:, 0]
        assert np.array_equal(b.y[:, i], b.x[:, i - 1] * v + other_tok)


@settings(max_examples=25, deadline=None)
@given(
    n_pairs=st.integers(1, 6),
    extra=st.integers(0, 4),
    n_values=st.integers(2, 6),
    seed=st.integers(0, 2**31),
    layout=st.sampled_from(["fused", "interleaved"]),
)
def test_recall_answer_is_always_present(n_pairs, extra, n_values, seed, layout):
    task = recall_task(n_pairs, n_pairs + extra, n_values, layout)
    b = task.sample(seed, 8)
    assert b.x.shape == (8, task.seq_len) and b.x.max() < task.vocab_size
    assert b.y.min() >= 0 and b.y.max() < n_values


@pytest.mark.parametrize(
    "make, kwargs, exc, word",
    [
        (recall_task, {"n_pairs": 0}, ValueError, "n_pairs"),
        (recall_task, {"n_pairs": 5, "n_keys": 3}, ValueError, "n_keys"),
        (recall_task, {"n_values": 1}, ValueError, "n_values"),
        (recall_task, {"layout": "zigzag"}, ValueError, "layout"),
        (copy_task, {"length": 2.5}, TypeError, "length"),
        (copy_task, {"vocab": 1}, ValueError, "vocab"),
        (previous_token_task, {"n": 1}, ValueError, "n"),
        (keyword_task, {"n_keywords": 0}, ValueError, "n_keywords"),
        (two_relation_task, {"other": "next"}, ValueError, "other"),
        (two_relation_task, {"n": 2}, ValueError, "n"),
    ],
)
def test_bad_task_arguments(make, kwargs, exc, word):
    with pytest.raises(exc, match=word):
        make(**kwargs)


def test_bad_sample_arguments():
    task = copy_task()
    with pytest.raises(TypeError, match="rng"):
        task.sample("seed", 4)
    with pytest.raises(ValueError, match="rng"):
        task.sample(-1, 4)
    with pytest.raises(ValueError, match="batch"):
        task.sample(0, 0)
