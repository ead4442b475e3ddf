"""Turning each stream response's text into the delta since the previous one."""

import logging

import pytest

pytest.importorskip("tritonclient.grpc")

from inferwire.backends.triton.streaming import DeltaTracker


def feed(tracker: DeltaTracker, responses: list[str]) -> list[str]:
    return [tracker.feed(text) for text in responses]


def test_auto_mode_takes_a_stream_that_extends_its_text_as_cumulative():
    tracker = DeltaTracker("auto")
    assert feed(tracker, ["a", "a b", "a b c", "a b c"]) == ["a", " b", " c", ""]
    assert tracker.mode == "cumulative"


def test_auto_mode_takes_a_stream_of_pieces_as_deltas():
    tracker = DeltaTracker("auto")
    assert feed(tracker, ["a", " b", " c"]) == ["a", " b", " c"]
    assert tracker.mode == "delta"


def test_empty_responses_give_no_delta_and_decide_nothing():
    tracker = DeltaTracker("auto")
    assert feed(tracker, ["", "a", ""]) == ["", "a", ""]
    assert tracker.mode == "auto"


def test_delta_mode_passes_repeated_text_through():
    assert feed(DeltaTracker("delta"), ["ab", "ab"]) == ["ab", "ab"]


def test_cumulative_stream_that_rewrites_its_text_switches_to_deltas(caplog):
    tracker = DeltaTracker("cumulative")
    with caplog.at_level(logging.WARNING, logger="inferwire.backends.triton"):
        assert feed(tracker, ["ab", "abc", "zz", "y"]) == ["ab", "c", "zz", "y"]
    assert tracker.mode == "delta"
    [record] = caplog.records
    assert record.name == "inferwire.backends.triton"
    assert record.getMessage() == (
        "a cumulative stream rewrote its text; treating responses as deltas"
    )


@pytest.mark.parametrize(
    ("mode", "responses", "deltas"),
    [
        ("auto", ["a", "a b", "a b c", "a b c"], ["a", " b", " c", ""]),
        ("auto", ["a", " b", " c"], ["a", " b", " c"]),
        ("auto", ["ab", "ab"], ["ab", ""]),  # ambiguous; taken as cumulative
        ("delta", ["ab", "ab"], ["ab", "ab"]),
        ("cumulative", ["x", "xy", ""], ["x", "y", ""]),
        # A "cumulative" stream that rewrites its text is treated as deltas from then on.
        ("cumulative", ["ab", "abc", "zz"], ["ab", "c", "zz"]),
    ],
)
def test_stream_responses_become_deltas(mode, responses, deltas):
    tracker = DeltaTracker(mode)
    assert [tracker.feed(text) for text in responses] == deltas
