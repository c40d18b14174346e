"""Prometheus's text format as we write it: prometheus_client's own parser reads it back."""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from llamad.client.exposition import Family, Sample, format_value, histogram_samples, render
from llamad.model.request_metrics import BUCKETS

pytestmark = pytest.mark.timeout(30)


def parse(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_families_parse_back_with_their_types_help_and_values() -> None:
    text = render(
        [
            Family(
                "llamad_requests_total",
                "counter",
                "Requests.",
                [
                    Sample((("model_name", "m"), ("outcome", "stop")), 3),
                    Sample((("model_name", "m"), ("outcome", "error")), 0),
                ],
            ),
            Family("vllm:kv_cache_usage_perc", "gauge", "KV use.", [Sample((), 0.25)]),
        ]
    )
    found = {f.name: f for f in text_string_to_metric_families(text)}
    # The parser names a counter without its _total; its samples keep it.
    requests = found["llamad_requests"]
    assert requests.type == "counter" and requests.documentation == "Requests."
    assert [(s.name, s.labels, s.value) for s in requests.samples] == [
        ("llamad_requests_total", {"model_name": "m", "outcome": "stop"}, 3),
        ("llamad_requests_total", {"model_name": "m", "outcome": "error"}, 0),
    ]
    usage = found["vllm:kv_cache_usage_perc"]
    assert usage.type == "gauge" and usage.samples[0].value == 0.25
    assert "# TYPE llamad_requests_total counter\n" in text


def test_a_histogram_is_cumulative_with_inf_sum_and_count() -> None:
    samples = histogram_samples({"model_name": "m"}, [0.1, 0.5], [2, 0, 3], 7.5)
    text = render([Family("x_seconds", "histogram", "X.", samples)])
    (family,) = text_string_to_metric_families(text)
    assert family.type == "histogram"
    lines = [(s.name, s.labels.get("le"), s.value) for s in family.samples]
    assert lines == [
        ("x_seconds_bucket", "0.1", 2),
        ("x_seconds_bucket", "0.5", 2),
        ("x_seconds_bucket", "+Inf", 5),
        ("x_seconds_sum", None, 7.5),
        ("x_seconds_count", None, 5),
    ]
    with pytest.raises(ValueError, match="counts for"):
        histogram_samples({}, [0.1], [1], 0.0)


def test_label_values_and_help_are_escaped() -> None:
    tricky = 'a"b\\c\nd'
    text = render(
        [Family("g", "gauge", "line one\nback\\slash", [Sample((("model_name", tricky),), 1)])]
    )
    (family,) = text_string_to_metric_families(text)
    assert family.samples[0].labels == {"model_name": tricky}
    assert family.documentation == "line one\nback\\slash"
    assert text.count("\n") == 3  # HELP, TYPE, one sample: no raw newline leaked


@pytest.mark.parametrize(
    "value",
    [0.0, 0.3, 1.0, 2560.0, 7680.0, 0.0005, 1e6, 1234567.0, 123456789.5, 1e-7, math.inf],
)
def test_floats_print_as_the_go_client_prints_them(value: float) -> None:
    # A dashboard selects buckets by their le text: ours must be the ecosystem's.
    assert format_value(value) == floatToGoString(value)


def test_every_bucket_bound_prints_as_prometheus_client_prints_it() -> None:
    for bounds in BUCKETS.values():
        for bound in bounds:
            assert format_value(bound) == floatToGoString(bound)


def test_integers_stay_integers_and_nan_is_nan() -> None:
    assert format_value(2**63) == str(2**63)
    assert format_value(float("nan")) == "NaN"
    assert format_value(-math.inf) == "-Inf"


@pytest.mark.parametrize(
    ("family", "message"),
    [
        (lambda: Family("bad name", "gauge", "x"), "metric name"),
        (lambda: Family("requests", "counter", "x"), "_total"),
        (lambda: Family("g", "gauge", "x", [Sample((("le-x", "1"),), 1)]), "label name"),
        (lambda: Family("g", "gauge", "x", [Sample((("__x", "1"),), 1)]), "label name"),
        (lambda: Family("g", "gauge", "x", [Sample((), 1, "_sum")]), "no '_sum'"),
    ],
)
def test_a_malformed_family_is_refused(family: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        family()  # type: ignore[operator]


def test_a_name_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        render([Family("g", "gauge", "x"), Family("g", "gauge", "y")])
