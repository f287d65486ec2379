"""Tests for attn_utils.book.seeding: one seed base, read from ATTN_SEED, behind every draw."""

import numpy as np
import pytest

import attn_utils as au


def test_unset_base_keeps_the_committed_draws(monkeypatch):
    monkeypatch.delenv("ATTN_SEED", raising=False)
    assert au.seed_base() == 0
    assert au.seeds(range(4)) == [0, 1, 2, 3]
    assert au.rng(2017).random() == np.random.default_rng(2017).random()
    monkeypatch.setenv("ATTN_SEED", "0")
    assert au.seed(5) == 5


def test_another_base_gives_new_distinct_draws(monkeypatch):
    monkeypatch.setenv("ATTN_SEED", "12345")
    training, selection = au.seeds(range(8)), au.seeds(range(100, 108))
    assert len(set(training + selection)) == 16  # labels stay distinct: selection never evaluates
    assert training != list(range(8))
    assert au.rng(2017).random() != np.random.default_rng(2017).random()
    assert au.seeds(range(8)) == training  # deterministic given the base
    monkeypatch.setenv("ATTN_SEED", "12346")
    assert set(au.seeds(range(8))).isdisjoint(training)


def test_base_is_read_at_call_time(monkeypatch):
    monkeypatch.setenv("ATTN_SEED", "1")
    a = au.seed(0)
    monkeypatch.setenv("ATTN_SEED", "2")
    assert au.seed(0) != a


@pytest.mark.parametrize("raw", ["abc", "-3", "1.5"])
def test_bad_base_names_the_variable(monkeypatch, raw):
    monkeypatch.setenv("ATTN_SEED", raw)
    with pytest.raises(ValueError, match="ATTN_SEED must be a non-negative integer"):
        au.seed_base()


@pytest.mark.parametrize("label", [-1, 1.5, "3", True])
def test_bad_label_is_refused(label):
    with pytest.raises(ValueError, match="label must be a non-negative integer"):
        au.seed(label)
