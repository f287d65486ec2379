"""Tests for attn_utils.book.checks: every check prints one verdict line and can fail."""

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

from attn_utils import MonteCarloMoments, SeedSummary, mc_moments  # re-exported at the top level
from attn_utils.book.checks import check, check_allclose, check_bound, check_count, check_seeds, measured

# ---------------------------------------------------------------- check


def test_check_passes_prints_and_returns_float(capsys):
    out = check("Var(q·k)/d_k", np.float64(1.003), 1, 0.05)
    assert type(out) is float and out == 1.003
    assert capsys.readouterr().out == "Var(q·k)/d_k = 1.003 (theory 1, tol 0.05)  ✓\n"


def test_check_fails_outside_tolerance(capsys):
    with pytest.raises(AssertionError, match=r"check failed: x = 1\.06 \(theory 1, tol 0\.05\)"):
        check("x", 1.06, 1.0, 0.05)
    assert capsys.readouterr().out.strip().endswith("✗")


def test_check_tolerance_is_inclusive_and_symmetric():
    check("edge", 1.5, 1.0, 0.5)
    check("below", 0.96, 1.0, 0.05)
    with pytest.raises(AssertionError):
        check("below", 0.94, 1.0, 0.05)


def test_check_relative(capsys):
    check("rel", 104.0, 100.0, 0.05, rel=True)
    assert "rel tol 0.05" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="rel tol"):
        check("rel", 106.0, 100.0, 0.05, rel=True)
    # an absolute tol of 0.05 would have rejected 104
    with pytest.raises(AssertionError):
        check("abs", 104.0, 100.0, 0.05)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_check_rejects_non_finite(bad):
    with pytest.raises(AssertionError):
        check("nonfinite", bad, 0.0, 1e300)


def test_check_format_spec(capsys):
    check("pi", math.pi, 3.14, 0.01, fmt=".6f")
    assert capsys.readouterr().out.startswith("pi = 3.141593 (theory 3.140000")


# ---------------------------------------------------------------- check_bound


def test_check_bound_passes_and_prints(capsys):
    assert check_bound("λ_max", 0.25, upper=0.5) == 0.25
    assert capsys.readouterr().out == "λ_max = 0.25 (expected ≤ 0.5)  ✓\n"
    check_bound("both", 0.3, lower=0.0, upper=0.5)
    assert capsys.readouterr().out == "both = 0.3 (expected ≥ 0 and ≤ 0.5)  ✓\n"


def test_check_bound_fails_above_upper(capsys):
    with pytest.raises(AssertionError, match=r"check failed: λ_max = 0\.6 \(expected ≤ 0\.5\)"):
        check_bound("λ_max", 0.6, upper=0.5)
    assert capsys.readouterr().out.strip().endswith("✗")


def test_check_bound_fails_below_lower():
    with pytest.raises(AssertionError, match="≥ 0"):
        check_bound("eig_min", -1e-3, lower=0.0)
    with pytest.raises(AssertionError):
        check_bound("both", 0.7, lower=0.0, upper=0.5)
    with pytest.raises(AssertionError):
        check_bound("both", -0.1, lower=0.0, upper=0.5)


def test_check_bound_rejects_nan_and_needs_a_bound():
    with pytest.raises(AssertionError):
        check_bound("nan", float("nan"), upper=1.0)
    with pytest.raises(ValueError, match="upper, lower or both"):
        check_bound("nothing", 1.0)


def test_check_bound_inclusive():
    check_bound("edge", 0.5, upper=0.5, lower=0.5)


# ---------------------------------------------------------------- check_allclose


def test_check_allclose_passes_and_prints(capsys):
    a = np.array([1.0, 2.0, 3.0])
    d = check_allclose("J vs autograd", a, a + 1e-13, atol=1e-12)
    assert d == pytest.approx(1e-13, rel=1e-2)
    line = capsys.readouterr().out
    # rounding-level differences vary by BLAS build, so a passing line prints only the tolerance
    assert line.startswith("J vs autograd: equal within atol 1e-12, rtol 1e-07")
    assert "e-13" not in line
    assert line.strip().endswith("✓")


def test_check_allclose_fails_on_difference(capsys):
    with pytest.raises(AssertionError, match=r"check failed: J: max \|difference\| = 0\.001 exceeds atol 1e-06"):
        check_allclose("J", np.zeros(3), np.array([0.0, 1e-3, 0.0]), atol=1e-6)
    assert capsys.readouterr().out.strip().endswith("✗")


def test_check_allclose_fails_on_shape_mismatch():
    # no silent broadcasting of (3,) against (1, 3)
    with pytest.raises(AssertionError, match="shapes differ"):
        check_allclose("shape", np.zeros(3), np.zeros((1, 3)))


def test_check_allclose_default_rtol_can_fail():
    with pytest.raises(AssertionError):
        check_allclose("rtol", np.array([1.0]), np.array([1.0 + 1e-6]))
    check_allclose("rtol", np.array([1.0]), np.array([1.0 + 1e-8]))


# ---------------------------------------------------------------- Monte Carlo moments


def test_mc_moments_exact_small_sample():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    m = mc_moments(x)
    assert isinstance(m, MonteCarloMoments) and m.n == 4
    assert m.mean == 2.5
    assert m.var == pytest.approx(5 / 3, rel=1e-15)  # unbiased (n − 1)
    assert m.mean_halfwidth == pytest.approx(1.96 * math.sqrt((5 / 3) / 4), rel=1e-15)
    assert m.var_halfwidth >= 0  # m4 − var² < 0 here: clipped, never NaN
    y = np.array([0.0, 0.0, 0.0, 0.0, 10.0])  # mean 2, var 80/4 = 20, m4 = (4·16 + 8⁴)/5 = 832
    my = mc_moments(y)
    assert my.var == pytest.approx(20.0, rel=1e-15)
    assert my.var_halfwidth == pytest.approx(1.96 * math.sqrt((832 - 20**2) / 5), rel=1e-14)


def test_mc_moments_z_and_axis():
    rng = np.random.default_rng(40)
    x = rng.normal(size=(50, 3))
    m1, m3 = mc_moments(x, z=1.0), mc_moments(x, z=3.0)
    np.testing.assert_allclose(m3.mean_halfwidth, 3 * m1.mean_halfwidth, rtol=1e-15)
    np.testing.assert_allclose(m3.var_halfwidth, 3 * m1.var_halfwidth, rtol=1e-15)
    mt = mc_moments(x.T, axis=1)
    np.testing.assert_allclose(mt.mean, m1.mean, rtol=1e-15)
    np.testing.assert_allclose(mt.var, x.var(axis=0, ddof=1), rtol=1e-14)
    with pytest.raises(ValueError, match="at least 2 draws"):
        mc_moments(np.ones((1, 4)))


def test_mc_moments_cis_cover_truth_exponential():
    # Exponential(scale 2): mean 2, variance 4, fourth central moment 9·2⁴ = 144.
    rng = np.random.default_rng(41)
    x = rng.exponential(scale=2.0, size=(200_000,))
    m = mc_moments(x, z=3.0)
    assert abs(m.mean - 2.0) <= m.mean_halfwidth
    assert abs(m.var - 4.0) <= m.var_halfwidth
    # the var half-width estimates z·sqrt((μ4 − σ⁴)/N) = 3·sqrt(128/N)
    assert m.var_halfwidth == pytest.approx(3 * math.sqrt(128 / x.size), rel=0.1)
    # a normal-theory half-width sqrt(2σ⁴/N) would be too narrow by a factor 2 for this heavy tail
    assert m.var_halfwidth > 1.8 * 3 * math.sqrt(2 * 16 / x.size)


def test_mc_moments_coverage_rate_normal():
    # Over many independent experiments the 95 % CIs cover the true mean and variance ≈ 95 % of the time.
    rng = np.random.default_rng(42)
    x = rng.normal(loc=1.0, scale=3.0, size=(400, 2000))  # 2000 experiments of 400 draws
    m = mc_moments(x, axis=0)
    cover_mean = np.mean(np.abs(m.mean - 1.0) <= m.mean_halfwidth)
    cover_var = np.mean(np.abs(m.var - 9.0) <= m.var_halfwidth)
    # binomial SE of a 95 % rate over 2000 trials ≈ 0.5 %
    assert 0.93 <= cover_mean <= 0.97, cover_mean
    assert 0.92 <= cover_var <= 0.97, cover_var
    # and a CI that is too narrow would be caught: half the width covers far less
    assert np.mean(np.abs(m.var - 9.0) <= m.var_halfwidth / 2) < 0.8


# ---------------------------------------------------------------- trained measurements: ≈, seeds, counts


def test_approx_marks_the_measured_value_only(capsys):
    check_bound("peak", 3210.0, lower=100, approx=True, fmt=".2g")
    assert capsys.readouterr().out == "peak = ≈3.2e+03 (expected ≥ 1e+02)  ✓\n"
    check("acc", 0.98, 1.0, 0.05, approx=True, fmt=".2f")
    assert capsys.readouterr().out == "acc = ≈0.98 (theory 1.00, tol 0.05)  ✓\n"


def test_check_seeds_passes_with_margin(capsys):
    s = check_seeds("acc", np.linspace(0.9, 1.0, 8), lower=0.5)
    assert isinstance(s, SeedSummary) and s.n == 8
    assert s.mean == pytest.approx(0.95) and s.se == pytest.approx(np.std(np.linspace(0.9, 1, 8), ddof=1) / 8**0.5)
    assert s.margin == pytest.approx((0.95 - 0.5) / s.se)
    line = capsys.readouterr().out
    assert line.startswith("acc = ≈0.95 ± ≈0.01 (mean ± SE of 8 seeds; expected ≥ 0.50, margin ≈")
    assert line.strip().endswith("SE ≥ 3)  ✓")


def test_check_seeds_fails_when_the_mean_clears_the_bound_by_too_few_standard_errors():
    values = np.linspace(0.4, 0.7, 8)  # mean 0.55 > 0.5, but only ~1.3 SE above it
    with pytest.raises(AssertionError, match="margin ≈1.3 SE ≥ 3"):
        check_seeds("acc", values, lower=0.5)
    check_seeds("acc", values, lower=0.5, z=1.0)
    with pytest.raises(AssertionError):
        check_seeds("acc", values, upper=0.5)  # on the wrong side altogether
    with pytest.raises(AssertionError):
        check_seeds("acc", values, lower=0.0, upper=0.6)  # the nearer bound decides


def test_check_seeds_identical_seeds_and_bad_input(capsys):
    s = check_seeds("solved", np.ones(8), lower=0.99)
    assert s.margin == np.inf and "margin ≈∞ SE" in capsys.readouterr().out
    with pytest.raises(AssertionError):
        check_seeds("solved", np.full(8, 0.98), lower=0.99)
    with pytest.raises(ValueError, match="at least 8 seeds, received 4"):
        check_seeds("few", np.ones(4), lower=0.5)
    with pytest.raises(ValueError, match=r"shape \(S,\); received shape \(2, 8\)"):
        check_seeds("2d", np.ones((2, 8)), lower=0.5)
    with pytest.raises(ValueError, match="upper, lower or both"):
        check_seeds("none", np.ones(8))
    with pytest.raises(AssertionError):
        check_seeds("nan", np.r_[np.ones(7), np.nan], lower=0.5)


def test_check_count(capsys):
    flags = np.array([True] * 7 + [False])
    assert check_count("solved", flags, at_least=6) == 7
    assert capsys.readouterr().out == "solved: ≈7 of 8 seeds (expected ≥ 6)  ✓\n"
    with pytest.raises(AssertionError, match="≈7 of 8 seeds"):
        check_count("solved", flags, at_most=6)
    with pytest.raises(TypeError, match="bool"):
        check_count("ints", np.ones(8), at_least=1)
    with pytest.raises(ValueError, match="at least 8 seeds"):
        check_count("few", np.ones(4, bool), at_least=1)


def test_sanitizer_rewrites_only_numbers_after_the_approx_mark():
    """tests/nbval_sanitize.cfg: the one rewrite nbval applies before comparing outputs."""
    import configparser
    import re
    from pathlib import Path

    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).parents[1] / "nbval_sanitize.cfg", encoding="utf-8")
    assert len(cfg.sections()) == 1
    rule = cfg[cfg.sections()[0]]
    sub = lambda s: re.sub(rule["regex"], rule["replace"], s)  # noqa: E731
    line = "acc = ≈0.95 ± ≈1.2e-03 (mean ± SE of 8 seeds; expected ≥ 0.50, margin ≈∞ SE ≥ 3)  ✓"
    assert sub(line) == "acc = ≈# ± ≈# (mean ± SE of 8 seeds; expected ≥ 0.50, margin ≈# SE ≥ 3)  ✓"
    exact = "Var(q·k)/d_k = 1.003 (theory 1, tol 0.05)  ✓"
    assert sub(exact) == exact


# ---------------------------------------------------------------- rules_out and se


def test_rules_out_is_printed_beside_the_verdict(capsys):
    check("Var(q·k)/d_k", 1.003, 1, 0.05, rules_out={"scaling by 1/d_k": 0.125})
    line = "Var(q·k)/d_k = 1.003 (theory 1, tol 0.05; scaling by 1/d_k would give 0.125)  ✓\n"
    assert capsys.readouterr().out == line


@pytest.mark.parametrize(
    "call",
    [
        lambda: check("x", 1.0, 1.0, 0.9, rules_out={"1/d_k": 0.125}),
        lambda: check("x", 1.0, 1.0, se=0.2, rules_out={"1/d_k": 0.125}),  # 5 SE = 1 accepts 0.125
        lambda: check("x", 100.0, 100.0, 0.5, rel=True, rules_out={"half": 60.0}),
        lambda: check_bound("p", 0.9, lower=0.2, rules_out={"uniform": 0.25}),
        lambda: check_seeds("acc", np.full(8, 0.9), lower=0.2, rules_out={"chance": 0.25}),
        lambda: check_count("solved", np.ones(8, bool), at_least=4, rules_out={"a coin": 4}),
        lambda: check_allclose("J", np.eye(2), np.eye(2), atol=1.0, rules_out={"zero": np.zeros((2, 2))}),
    ],
)
def test_a_tolerance_that_accepts_the_wrong_answer_is_refused_before_comparing(call, capsys):
    with pytest.raises(ValueError, match="wrong answer"):
        call()
    assert capsys.readouterr().out == ""  # refused at definition time: no verdict printed


def test_rules_out_must_be_a_dict():
    with pytest.raises(TypeError, match="rules_out must be"):
        check("x", 1.0, 1.0, 0.1, rules_out=0.125)


def test_check_with_standard_error(capsys):
    check("mean", 0.51, 0.5, se=0.004, rules_out={"0.6": 0.6})
    assert "tol 5 SE = 0.02" in capsys.readouterr().out
    with pytest.raises(AssertionError):
        check("mean", 0.53, 0.5, se=0.004)
    check("mean", 0.53, 0.5, se=0.004, z=10)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: check("x", 1.0, 1.0), "exactly one of tol"),
        (lambda: check("x", 1.0, 1.0, 0.1, se=0.01), "exactly one of tol"),
        (lambda: check("x", 1.0, 1.0, -0.1), "tol must be ≥ 0"),
        (lambda: check("x", 1.0, 1.0, se=-1.0), "se must be"),
        (lambda: check("x", 1.0, 1.0, se=float("nan")), "se must be"),
        (lambda: check_bound("x", 1.0, lower=2.0, upper=1.0), "lower"),
        (lambda: check_seeds("x", np.ones(8), lower=2.0, upper=1.0), "lower"),
        (lambda: check_count("x", np.ones(8, bool), at_least=5, at_most=3), "at_least"),
        (lambda: check_allclose("x", 1.0, 1.0, atol=-1.0), "atol and rtol"),
    ],
)
def test_nonsense_tolerances_are_refused(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


def test_check_bound_with_standard_error_needs_a_margin(capsys):
    check_bound("p", 0.8, lower=0.5, se=0.01)
    assert "by 5 SE = 0.05" in capsys.readouterr().out
    with pytest.raises(AssertionError):
        check_bound("p", 0.52, lower=0.5, se=0.01)  # above the bound, but within 5 SE of it


def test_rules_out_in_check_seeds_and_count_lines(capsys):
    check_seeds("acc", np.linspace(0.9, 0.95, 8), lower=0.5, rules_out={"chance": 0.25})
    check_count("solved", np.ones(8, bool), at_least=7, rules_out={"a coin": 4})
    out = capsys.readouterr().out
    assert "chance would give 0.25)" in out and "a coin would give 4)" in out


def test_a_measured_wrong_answer_is_printed_as_a_trained_measurement(capsys):
    # its digits vary by machine, so they carry the "≈" that the nbval sanitizer masks; constants do not
    check_seeds("acc", np.linspace(0.9, 0.95, 8), lower=0.5, rules_out={"the baseline": measured(0.3), "chance": 0.25})
    out = capsys.readouterr().out
    assert "the baseline would give ≈0.30;" in out and "chance would give 0.25)" in out
    with pytest.raises(ValueError, match="also accepts"):  # still a number to the check
        check_seeds("acc", np.linspace(0.9, 0.95, 8), lower=0.5, rules_out={"the baseline": measured(0.9)})


def test_closeness_log_records_how_near_each_check_came_to_failing(tmp_path, monkeypatch):
    # tools/reseed.py estimates false-failure rates from this log: used > 1 exactly when a check fails
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv("ATTN_CHECK_LOG", str(log))
    check("a", 1.02, 1.0, se=0.01)  # 2 SE off of 5 allowed
    check_bound("b", 0.9, lower=0.5, se=0.02)  # 20 SE above the bound, 5 needed
    check_seeds("c", [1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0, 1.0], lower=0.0)
    with pytest.raises(AssertionError):
        check("d", 1.2, 1.0, tol=0.1)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["name"] for r in rows] == ["a", "b", "c", "d"]
    assert rows[0]["used"] == pytest.approx(0.4) and rows[0]["spare_se"] == pytest.approx(3.0)
    assert rows[1]["used"] == pytest.approx(0.25) and rows[1]["spare_se"] == pytest.approx(15.0)
    assert 0 < rows[2]["used"] < 1 and rows[2]["spare_se"] > 0
    assert rows[3]["used"] == pytest.approx(2.0) and rows[3]["spare_se"] is None


def test_closeness_log_records_a_count_of_seeds_with_its_range(tmp_path, monkeypatch):
    # tools/reseed.py estimates a count's false-failure rate from the raw count, not from standard errors
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv("ATTN_CHECK_LOG", str(log))
    check_count("six", np.arange(8) < 6, at_least=5)
    with pytest.raises(AssertionError):
        check_count("four", np.arange(8) < 4, at_least=5)
    check_count("none", np.zeros(8, bool), at_most=1)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["count"], r["seeds"], r["at_least"], r["at_most"]) for r in rows] == [
        (6, 8, 5, None),
        (4, 8, 5, None),
        (0, 8, None, 1),
    ]
    assert rows[0]["used"] < 1 < rows[1]["used"] and rows[2]["used"] == 0 and rows[0]["spare_se"] is None


def test_reseed_estimates_a_counts_false_failure_rate_from_the_binomial():
    # the estimate tools/reseed.py prints for check_count: the pooled rate, then the binomial tail
    spec = importlib.util.spec_from_file_location("reseed", Path(__file__).parents[2] / "tools" / "reseed.py")
    reseed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reseed)
    records = [{"count": 4, "seeds": 8, "at_least": 3, "at_most": None}] * 20  # 80 of 160 seeds: p ≈ 1/2
    p = 80.5 / 161
    below = sum(math.comb(8, k) * p**k * (1 - p) ** (8 - k) for k in range(3))
    assert reseed._count_failure_rate(records) == pytest.approx(below)
    assert 0.1 < below < 0.2  # a threshold a coin misses one time in seven is what the table must flag
    never = [{"count": 0, "seeds": 8, "at_least": None, "at_most": 1}] * 20
    assert reseed._count_failure_rate(never) < 1e-3
