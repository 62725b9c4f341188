"""The metric registry: the documented example (docs/operating.md) parses; every bad field
is named."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from crowdmix.core.basic import BasicParams
from crowdmix.core.params import RapporParams
from crowdmix.core.registry import RegistryError, ShufflePolicy, load_registry, parse_registry
from tests.doc_pages import registry_example


def _example_toml() -> str:
    return registry_example()


def _example() -> dict[str, Any]:
    return tomllib.loads(_example_toml())


def test_documented_example_parses(tmp_path: Path) -> None:
    path = tmp_path / "metrics.toml"
    path.write_text(_example_toml())
    reg = load_registry(path)
    assert reg.window_seconds == 86400
    home = reg["home_page"]
    assert home.rappor == RapporParams(k=128, h=2, m=64, f=0.5, p=0.5, q=0.75)
    assert (home.encoding, home.hashing, home.num_cohorts, home.report_bytes) == (
        "rappor",
        "mmh3",
        64,
        16,
    )
    assert home.shuffle == ShufflePolicy()
    assert home.fingerprint == home.rappor.fingerprint("mmh3")
    browser = reg["browser"]
    assert browser.basic == BasicParams(mechanism="oue", epsilon=2.0, domain_size=3)
    assert browser.domain == ("chrome", "firefox", "safari")
    assert (browser.num_cohorts, browser.report_bytes) == (1, 1)
    assert reg.get("nope") is None
    assert reg.window_of(86400 * 3 + 5) == 3


def _with(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    data = _example()
    table = data
    for key in path[:-1]:
        table = table[key]
    if value is _DELETE:
        del table[path[-1]]
    else:
        table[path[-1]] = value
    return data


_DELETE = object()

BAD: list[tuple[tuple[str, ...], Any, str]] = [
    (("metrics", "home_page", "k"), 0, "'home_page': k"),
    (("metrics", "home_page", "h"), 9, "'home_page': h"),
    (("metrics", "home_page", "m"), -1, "'home_page': m"),
    (("metrics", "home_page", "f"), 1.0, "'home_page': f"),
    (("metrics", "home_page", "p"), 0.9, "'home_page': p must be below q"),
    (("metrics", "home_page", "q"), "x", "'home_page': q"),
    (("metrics", "home_page", "hashing"), "sha1", "'home_page': hashing"),
    (("metrics", "home_page", "encoding"), "bloom", "'home_page': encoding"),
    (("metrics", "home_page", "colour"), 1, "'home_page': unknown field"),
    (("metrics", "home_page", "shuffle", "min_batch"), 0, "'home_page': min_batch"),
    (("metrics", "home_page", "shuffle", "max_batch"), 10, "'home_page': max_batch"),
    (("metrics", "home_page", "shuffle", "max_delay_seconds"), 0, "'home_page': max_delay"),
    (("metrics", "home_page", "shuffle", "drop_probability"), 1.0, "'home_page': drop_prob"),
    (("metrics", "home_page", "shuffle", "disposal_days"), -1, "'home_page': disposal_days"),
    (("metrics", "home_page", "shuffle", "burst"), 1, "'home_page': unknown shuffle"),
    (("metrics", "browser", "epsilon"), _DELETE, "'browser': epsilon is required"),
    (("metrics", "browser", "epsilon"), -2.0, "'browser': epsilon"),
    (("metrics", "browser", "domain"), ["a", "a"], "'browser': domain values must be distinct"),
    (("metrics", "browser", "domain"), "chrome", "'browser': domain must be a list"),
    (("metrics", "browser", "k"), 8, "'browser': unknown field"),
    # nothing that sets a privacy figure is filled in
    *(
        (("metrics", "home_page", key), _DELETE, f"'home_page': {key} is required for rappor")
        for key in ("k", "h", "m", "f", "p", "q")
    ),
    (("metrics", "home_page", "encoding"), _DELETE, "'home_page': encoding is required"),
    (("metrics", "browser", "domain"), _DELETE, "'browser': domain .*is required for oue"),
    (("metrics", "app_screen", "domain_size"), _DELETE, "'app_screen': domain or domain_size"),
    (("collection", "window_seconds"), 60, "window_seconds"),
    (("collection", "window_second"), 86400, "unknown collection field"),
    (("collection",), 5, "collection must be a table"),
]


@pytest.mark.parametrize(("path", "value", "message"), BAD)
def test_bad_field_names_metric_and_field(path: tuple[str, ...], value: Any, message: str) -> None:
    with pytest.raises(RegistryError, match=r"metric " + message if "'" in message else message):
        parse_registry(_with(path, value))


def test_a_krr_metric_without_a_domain_is_refused_and_binary_rr_needs_none() -> None:
    krr = {"metrics": {"b": {"encoding": "krr", "epsilon": 1.0}}}
    with pytest.raises(RegistryError, match=r"metric 'b': domain \(or domain_size\) is required"):
        parse_registry(krr)
    binary = parse_registry({"metrics": {"b": {"encoding": "binary-rr", "epsilon": 1.0}}})
    assert binary["b"].domain_size == 2


def test_every_missing_rappor_parameter_is_named_at_once() -> None:
    with pytest.raises(RegistryError, match=r"metric 'x': f, q are required for rappor"):
        parse_registry(
            {"metrics": {"x": {"encoding": "rappor", "k": 16, "h": 2, "m": 4, "p": 0.25}}}
        )


def test_bad_files_and_tables(tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match="does not exist"):
        load_registry(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[metrics\n")
    with pytest.raises(RegistryError, match="not valid TOML"):
        load_registry(bad)
    with pytest.raises(RegistryError, match=r"no \[metrics\.NAME\]"):
        parse_registry({})
    with pytest.raises(RegistryError, match="unknown top-level"):
        parse_registry({**_example(), "extra": {}})
    with pytest.raises(RegistryError, match="metric name"):
        parse_registry({"metrics": {"bad name!": {"k": 8}}})
    with pytest.raises(RegistryError, match="k must be at most 32 with rappor-md5"):
        parse_registry(_with(("metrics", "home_page", "hashing"), "rappor-md5"))


def test_daemon_tables_share_the_file_but_other_tables_do_not(tmp_path: Path) -> None:
    text = '[metrics.a]\nencoding = "binary-rr"\nepsilon = 1.0\n'
    for table in ("shuffler", "aggregator"):
        path = tmp_path / f"{table}.toml"
        path.write_text(text + f'\n[{table}]\nlisten = "127.0.0.1:0"\n')
        assert set(load_registry(path).metrics) == {"a"}
    path = tmp_path / "typo.toml"
    path.write_text(text + "\n[shufler]\nlisten = 1\n")
    with pytest.raises(
        RegistryError, match=r"typo.toml: unknown top-level table\(s\) \['shufler'\]"
    ):
        load_registry(path)
    with pytest.raises(RegistryError, match="cannot read metric registry"):
        load_registry(tmp_path)  # a directory


def _histogram(**shuffle: Any) -> dict[str, Any]:
    table: dict[str, Any] = {
        "encoding": "shuffled-histogram",
        "domain_size": 1000,
        "fake_slots": 1,
        "fake_probability": 0.05,
    }
    if shuffle:
        table["shuffle"] = shuffle
    return {"metrics": {"screens": table}}


def _krr(**shuffle: Any) -> dict[str, Any]:
    table = {"encoding": "krr", "epsilon": 1.0, "domain_size": 3, "shuffle": shuffle}
    return {"metrics": {"b": table}}


def test_a_histogram_is_released_per_window_and_max_batch_is_the_window_ceiling() -> None:
    from crowdmix.core.registry import MAX_BATCH_BYTES, MAX_BATCH_REPORTS, window_batch_limit
    from crowdmix.core.sealed import sealed_length

    limit = window_batch_limit(2)  # d = 1000: 2-byte reports
    assert limit == min(MAX_BATCH_REPORTS, MAX_BATCH_BYTES // (sealed_length(2) + 8))
    assert limit >= 3_000_000  # n = 1e6 devices at ~1.04 reports each fit one batch
    policy = parse_registry(_histogram())["screens"].shuffle
    assert (policy.release, policy.release_grace_seconds, policy.max_batch) == (
        "window",
        300.0,
        limit,
    )
    assert parse_registry(_histogram(max_batch=2_000_000))["screens"].shuffle.max_batch == (
        2_000_000
    )
    with pytest.raises(RegistryError, match=r"max_batch 10000000 .* exceeds what one aggregator"):
        parse_registry(_histogram(max_batch=10_000_000))
    # the explicit opt-out: batches by max_batch, as any other encoding
    opt_out = parse_registry(_histogram(release="max_batch", max_batch=10_000_000))
    assert opt_out["screens"].shuffle.release == "max_batch"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_histogram(release_grace_seconds=86400), "shorter than the collection window"),
        (_histogram(release_grace_seconds=-1), "release_grace_seconds must be a number >= 0"),
        (
            _histogram(release_grace_seconds=600, disposal_days=0.005),
            "shorter than the disposal age",
        ),
        (_histogram(release="weekly"), "release must be one of"),
        (_histogram(release="max_batch", release_grace_seconds=60), "is for release = 'window'"),
        (
            _krr(release="window"),
            "release = 'window' is for shuffled histograms and heavy hitters only",
        ),
        (_krr(release_grace_seconds=1), "release_grace_seconds is for release = 'window'"),
    ],
)
def test_bad_window_release_settings_are_named(data: dict[str, Any], message: str) -> None:
    with pytest.raises(RegistryError, match=message):
        parse_registry(data)
