"""Shuffled histograms: the statement is sound.

Each test names the defect it keeps out: a figure below a valid lower bound, a printed
figure rounded down, or a statement made for a release it does not describe.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from crowdmix.aggregator.accounting.histogram import fake_delta, histogram_delta, shift_delta
from crowdmix.aggregator.accounting.histogram_release import histogram_release
from crowdmix.core.histogram import HistogramParams

Hist = tuple[int, ...]


def _conv(a: dict[Hist, float], b: dict[Hist, float]) -> dict[Hist, float]:
    out: dict[Hist, float] = defaultdict(float)
    for ka, pa in a.items():
        for kb, pb in b.items():
            out[tuple(map(operator.add, ka, kb))] += pa * pb
    return dict(out)


def _unit(d: int, j: int) -> Hist:
    return tuple(int(i == j) for i in range(d))


def _real(d: int, x: int, local_epsilon: float | None) -> dict[Hist, float]:
    if local_epsilon is None:
        return {_unit(d, x): 1.0}
    e = math.exp(local_epsilon)
    return {_unit(d, y): (e if y == x else 1.0) / (e + d - 1) for y in range(d)}


def _fakes(d: int, m: int, q: float) -> dict[Hist, float]:
    slot = {(0,) * d: 1.0 - q} | {_unit(d, j): q / d for j in range(d)}
    out: dict[Hist, float] = {(0,) * d: 1.0}
    for _ in range(m):
        out = _conv(out, slot)
    return out


def _mechanism(params: HistogramParams, values: tuple[int, ...]) -> dict[Hist, float]:
    """The analyst's whole histogram, every device (the target first) following the
    protocol: its k-RR'd real report and its own Binomial(m, q) uniform fakes."""
    d, m, q = params.domain_size, params.fake_slots, params.fake_probability
    out: dict[Hist, float] = {(0,) * d: 1.0}
    fakes = _fakes(d, m, q)
    for v in values:
        out = _conv(_conv(out, _real(d, v, params.local_epsilon)), fakes)
    return out


def _hockey(p: dict[Hist, float], q: dict[Hist, float], eps: float) -> float:
    e = math.exp(eps)
    return sum(max(0.0, pr - e * q.get(h, 0.0)) for h, pr in p.items())


@pytest.mark.parametrize(
    ("d", "n", "m", "q", "local"),
    [(2, 3, 2, 0.5, None), (3, 3, 2, 0.7, None), (2, 4, 3, 0.3, None), (3, 3, 2, 0.7, 1.0)],
)
def test_figure_bounds_the_brute_force_mechanism_with_the_targets_own_fakes(
    d: int, n: int, m: int, q: float, local: float | None
) -> None:
    """Independent enumeration of the real mechanism (the target's own fakes and the
    others' k-RR included, both directions): the figure, which treats those as known,
    is never below it."""
    params = HistogramParams(domain_size=d, fake_slots=m, fake_probability=q, local_epsilon=local)
    for others in itertools.product(range(d), repeat=n - 1):
        p = _mechanism(params, (0, *others))
        qv = _mechanism(params, (1, *others))
        for eps in (0.0, 0.2, 0.7, 1.5):
            exact = max(_hockey(p, qv, eps), _hockey(qv, p, eps))
            assert exact <= histogram_delta(eps, params, n_honest=n - 1) + 1e-15


def test_colluding_view_of_one_call_is_within_local_epsilon() -> None:
    """Shuffler + aggregator see one device's call as a multiset: k-RR'd real report
    plus uniform fakes. Its privacy loss, computed exactly, is at most ε_L."""
    for d, m, q, eps_l in [(3, 2, 0.6, 1.0), (2, 3, 1.0, 0.5), (4, 2, 0.3, 2.0)]:
        fakes = _fakes(d, m, q)
        views = [_conv(_real(d, x, eps_l), fakes) for x in range(d)]
        assert all(views[0].get(h, 0.0) > 0.0 for v in views for h, pr in v.items() if pr)
        worst = max(
            math.log(pr / views[y][h])
            for x, y in itertools.permutations(range(d), 2)
            for h, pr in views[x].items()
            if pr > 0.0
        )
        assert worst <= eps_l + 1e-12


@pytest.mark.slow
def test_fake_delta_is_not_below_the_high_precision_mixture_at_1e8_slots() -> None:
    """scipy's binom.logpmf loses ~1e-7 relative at 10^8 trials (log-gamma
    cancellation): the figure came out 1.45e-7 *below* the mixture weighted with
    exact binomial pmfs, more than the 1e-9 margin it claims. Now within it."""
    mp = pytest.importorskip("mpmath")
    trials, s, eps = 10**8, 4.3e-5, 0.1
    s2 = 2 * s
    mu = trials * s2
    w = int(8 * math.sqrt(mu))
    t = np.arange(int(mu) - w, int(mu) + w + 1)
    per_t = shift_delta(eps, t)  # checked against brute force in test_accounting.py
    mp.mp.dps = 30
    lp, lq, lg_n = mp.log(s2), mp.log1p(-s2), mp.loggamma(trials + 1)
    exact_weights = mp.fsum(
        mp.exp(
            lg_n
            - mp.loggamma(int(k) + 1)
            - mp.loggamma(trials - int(k) + 1)
            + int(k) * lp
            + (trials - int(k)) * lq
        )
        * mp.mpf(float(v))
        for k, v in zip(t, per_t, strict=True)
    )  # a lower bound: M's mass outside ±8 sd is left out
    ours = fake_delta(eps, n_honest=trials, fake_slots=1, bucket_probability=s)
    assert ours >= float(exact_weights)


def test_printed_delta_is_never_rounded_down() -> None:
    from crowdmix.aggregator.accounting.histogram import format_g_up

    assert format_g_up(1.24e-6) == "1.3e-06"  # "%.2g" gives 1.2e-06
    assert format_g_up(1e-6) == "1e-06"
    for x in (1.24e-6, 9.96e-7, 3.3333e-5, 1e-6, 0.5, 2.049e-9):
        assert float(format_g_up(x)) >= x
    params = HistogramParams(domain_size=50, fake_slots=2, fake_probability=0.4)
    text = histogram_release("h", params, 28_000, delta=1.24e-6).render()
    assert "δ = 1.3e-06" in text and "1.2e-06" not in text


REGISTRY = """
[metrics.h]
encoding = "shuffled-histogram"
domain_size = 50
fake_slots = 2
fake_probability = 0.4
[metrics.h.shuffle]
min_batch = 1000
"""


def test_privacy_metric_refuses_batch_sizes_that_do_not_add_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--batch-sizes 1000,1000 --n 28000` used to be replaced silently by one batch of
    28,000 reports, stating the whole window's ε (0.36) where batches of 1,000 give none."""
    from crowdmix.cli import main

    reg = tmp_path / "metrics.toml"
    reg.write_text(REGISTRY)
    base = ["privacy", "metric", "--config", str(reg), "--metric", "h", "--n", "28000"]
    assert main([*base, "--batch-sizes", "1000,1000"]) != 0
    captured = capsys.readouterr()
    assert "ε = " not in captured.out and "add up" in captured.err
    assert "Traceback" not in captured.err
    params = HistogramParams(domain_size=50, fake_slots=2, fake_probability=0.4)
    with pytest.raises(ValueError, match="add up"):
        histogram_release("h", params, 28_000, batch_sizes=(1000, 1000))
    with pytest.raises(ValueError, match="add up"):
        histogram_release("h", params, 2_000, batch_sizes=(2001, -1))


def test_statement_names_what_the_aggregator_could_link_by_report_and_key_ids() -> None:
    """A call stored twice (a retried DEADLINE_EXCEEDED whose first attempt was stored:
    allowed by design) shows the aggregator, by its repeated report ids, the device's
    whole report set. Without k-RR that set holds the true value: computed exactly,
    δ at the stated ε is then at least P(no fake) = (1 − q)^m, far above any δ stated.
    The figure cannot hold for that device, so the statement must say what it assumes."""
    params = HistogramParams(domain_size=50, fake_slots=2, fake_probability=0.4)
    stated = histogram_release("h", params, 28_000)
    assert math.isfinite(stated.epsilon)
    d, m, q = 3, params.fake_slots, params.fake_probability
    linked = [_conv(_real(d, x, None), _fakes(d, m, q)) for x in (0, 1)]
    assert _hockey(linked[0], linked[1], stated.epsilon) >= (1 - q) ** m - 1e-12 > stated.delta
    text = stated.render()
    assert "no call stored twice" in text and "sealed to one key" in text
    assert "in this collection window" in text and "R·ε, R·δ" in text
    assumptions = stated.to_dict()["assumptions"]
    assert isinstance(assumptions, list) and any("stored twice" in a for a in assumptions)


def test_simulate_refuses_one_report_per_call_for_a_histogram() -> None:
    """--mode unary sent a device's reports from different threads, one per call, so they
    lay scattered among other devices' in the store: not the one call per device the
    crowd bound assumes. Refused before anything is encoded or sent."""
    from crowdmix.core.registry import parse_registry
    from crowdmix.simulate import simulate

    table = {"encoding": "shuffled-histogram", "domain_size": 8, "fake_slots": 2}
    metric = parse_registry({"metrics": {"h": table | {"fake_probability": 0.5}}})["h"]
    with pytest.raises(ValueError, match="mode batched"):
        simulate("127.0.0.1:9", metric, clients=10, mode="unary")


def test_report_refuses_a_merged_counts_file_even_with_rounds_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A counts file of several windows with `--rounds 1` used to get one window's
    statement, its device bound taken from the merged total (every device counted once
    per window): a crowd several times too large. No central figure is printed."""
    from crowdmix.cli import main
    from tests.histogram.test_wiring import _counts_file

    reg, merged = _counts_file(tmp_path, window=None)
    args = ["report", "--counts", str(merged), "--config", str(reg), "--metric", "h"]
    code = main([*args, "--rounds", "1", "--no-plot", "--out", str(tmp_path / "o")])
    captured = capsys.readouterr()
    assert code != 0 and "per collection window" in captured.err
    assert "ε = " not in captured.out and not (tmp_path / "o" / "summary.json").exists()


def test_repeated_report_ids_withdraw_the_central_figure_and_leave_only_local() -> None:
    """The defect above, closed: a window in which the aggregator saw report ids twice
    (or whose record of that is missing) states no central number, only ε_L (∞
    without k-RR), and says why in one line; text and JSON alike."""
    params = HistogramParams(domain_size=50, fake_slots=2, fake_probability=0.4)
    clean = histogram_release("h", params, 28_000, duplicate_reports=0)
    assert not clean.linked and math.isfinite(clean.epsilon)
    assert clean.to_dict()["central"] is not None and clean.to_dict()["central_withheld"] is None
    linked = histogram_release("h", params, 28_000, duplicate_reports=3)
    assert linked.linked and math.isinf(linked.epsilon)  # not even in the value object
    text = linked.render()
    assert (
        "3 report ids were seen twice in this window: the aggregator may have linked a "
        "device's reports; no central guarantee" in text
    )
    assert "ε_L = ∞" in text and "ε = " not in text and "δ = " not in text
    as_json = linked.to_dict()
    assert as_json["central"] is None and as_json["central_total"] is None
    assert as_json["duplicate_reports"] == 3 and "seen twice" in str(as_json["central_withheld"])
    unknown = histogram_release("h", params, 28_000, duplicate_reports=None)
    assert unknown.linked and "do not record" in unknown.render()
    assert unknown.to_dict()["duplicate_reports"] is None
    with_krr = HistogramParams(
        domain_size=50, fake_slots=2, fake_probability=0.4, local_epsilon=2.0
    )
    text = histogram_release("h", with_krr, 28_000, duplicate_reports=1).render()
    assert "ε_L = 2.000-LDP" in text and "ε = " not in text
    with pytest.raises(ValueError, match="duplicate_reports"):
        histogram_release("h", params, 28_000, duplicate_reports=-1)
    readme = " ".join((Path(__file__).parents[2] / "docs" / "privacy.md").read_text().split())
    assert (
        "`N report ids were seen twice in this window: the aggregator may have linked a "
        "device's reports; no central guarantee`" in readme
    )


def test_report_job_withholds_the_central_figure_unless_the_count_is_zero() -> None:
    """The report job passes the store's count; unknown (None, the default) is not 0.
    Other encodings: the count is informational and changes no figure (a repeated
    single-message report is a copy of one counted report, linked to nothing)."""
    from crowdmix.aggregator.report.job import privacy_figures
    from crowdmix.core.params import RapporParams
    from crowdmix.core.registry import MetricConfig, ShufflePolicy, parse_registry

    table = {"encoding": "shuffled-histogram", "domain_size": 8, "fake_slots": 2}
    metric = parse_registry({"metrics": {"h": table | {"fake_probability": 0.5}}})["h"]
    totals = np.array([20_000], dtype=np.int64)
    stated = {d: privacy_figures(metric, totals, duplicate_reports=d) for d in (0, 2, None)}
    assert stated[0]["statement"]["central"] is not None
    assert stated[2]["statement"]["central"] is None
    assert stated[None]["statement"]["central"] is None
    assert privacy_figures(metric, totals)["statement"]["central"] is None
    rappor = MetricConfig(
        name="m",
        rappor=RapporParams(k=64, h=2, m=8, f=0.25, p=0.25, q=0.75),
        shuffle=ShufflePolicy(min_batch=1000),
    )
    cohorts = np.full(8, 5000, dtype=np.int64)
    figures = [privacy_figures(rappor, cohorts, duplicate_reports=d) for d in (0, 40, None)]
    assert figures[0]["statement"] == figures[1]["statement"] == figures[2]["statement"]
    assert [f["duplicate_reports"] for f in figures] == [0, 40, None]


def test_counts_file_carries_the_count_and_a_file_without_it_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A counts file records the count (exported from the store); -1 is unknown: the
    statement refuses the central figure, conservatively. A file without the field is
    not a counts file of this version and is refused, naming the field."""
    from crowdmix.aggregator.counting.files import CountsFileError, load_counts
    from crowdmix.cli import main
    from tests.histogram.test_wiring import _counts_file

    for given, linked in ((0, False), (4, True), (None, True)):
        reg, path = _counts_file(tmp_path, window=20000, duplicate_reports=given)
        assert load_counts(path).duplicate_reports == given
        args = ["report", "--counts", str(path), "--config", str(reg), "--metric", "h"]
        assert main([*args, "--no-plot", "--out", str(tmp_path / f"o{given}")]) in (0, 1)
        out = capsys.readouterr().out
        assert ("no central (ε, δ)" in out) is linked and ("δ = " in out) is not linked
    # a file written before the field existed: no such entry at all
    with np.load(path, allow_pickle=False) as data:
        fields = {k: data[k] for k in data.files if k != "duplicate_reports"}
    old = tmp_path / "old.npz"
    np.savez_compressed(old, **fields)
    with pytest.raises(CountsFileError, match="duplicate_reports"):
        load_counts(old)
