from inferwire.core.backend import GenerationEvents
from inferwire.core.generation import stop_at_sequences
from inferwire.core.record import RequestRecord
from inferwire.core.results import FinishReason, GenerationEnd, TextDelta, TokenLogprob, Usage
from inferwire.core.stop_sequences import StopSequenceMatcher


def feed_all(stops: tuple[str, ...], pieces: list[str]) -> tuple[list[str], bool]:
    matcher = StopSequenceMatcher(stops)
    emitted = []
    for piece in pieces:
        text, matched = matcher.feed(piece)
        emitted.append(text)
        if matched:
            return emitted, True
    emitted.append(matcher.flush())
    return emitted, False


def test_stop_string_split_across_deltas_is_never_emitted():
    emitted, matched = feed_all(("END",), ["hello E", "N", "D tail"])
    assert matched
    assert "".join(emitted) == "hello "
    assert all("E" not in piece for piece in emitted)


def test_partial_match_that_fails_is_released():
    emitted, matched = feed_all(("END",), ["an E", "NTRY", " here"])
    assert not matched
    assert "".join(emitted) == "an ENTRY here"


def test_earliest_of_several_stop_strings_wins():
    emitted, matched = feed_all(("world", "lo"), ["hello world"])
    assert matched
    assert "".join(emitted) == "hel"


def test_the_matcher_names_the_stop_string_it_found():
    matcher = StopSequenceMatcher(("world", "lo", "hel"))
    text, matched = matcher.feed("hello world")
    assert (text, matched, matcher.matched) == ("", True, "hel")  # the earliest in the text
    tie = StopSequenceMatcher(("ab", "abc"))
    assert tie.feed("xabcd") == ("x", True) and tie.matched == "ab"  # a tie: the first given
    none = StopSequenceMatcher(("zz",))
    none.feed("abc")
    assert none.matched == ""


def test_text_without_stops_passes_through_unchanged():
    emitted, matched = feed_all((), ["a", "b", "c"])
    assert not matched
    assert emitted == ["a", "b", "c", ""]


# Log-probabilities stay with their text while stop strings hold it back or cut it.


def token(text: str) -> TokenLogprob:
    return TokenLogprob(text, len(text), -1.0)


async def stop_events(pieces: list[str], stops: tuple[str, ...]) -> list[TextDelta | GenerationEnd]:
    """stop_at_sequences over deltas that each carry one token whose text is the delta's."""

    async def backend() -> GenerationEvents:
        for count, piece in enumerate(pieces, start=1):
            yield TextDelta(piece, count, (token(piece),) if piece else ())
        yield GenerationEnd(FinishReason.LENGTH, Usage(1, len(pieces)))

    return [event async for event in stop_at_sequences(backend(), stops, RequestRecord("r", "m"))]


def deltas(events: list[TextDelta | GenerationEnd]) -> list[tuple[str, list[str]]]:
    return [(e.text, [t.token for t in e.logprobs]) for e in events if isinstance(e, TextDelta)]


async def test_held_back_text_keeps_its_logprobs_until_it_is_emitted():
    events = await stop_events(["Hello E", "N", "TRY"], ("END",))
    assert deltas(events) == [("Hello ", []), ("ENTRY", ["Hello E", "N", "TRY"])]


async def test_logprobs_of_text_held_at_the_end_ride_on_the_flush():
    events = await stop_events(["ab", "cE", "N"], ("END",))
    assert deltas(events) == [("ab", ["ab"]), ("c", []), ("EN", ["cE", "N"])]
    assert isinstance(events[-1], GenerationEnd)


async def test_tokens_after_the_cut_are_dropped_and_a_straddling_token_is_kept():
    events = await stop_events(["ab", "cST", "OPd", "ef"], ("STOP",))
    # "cST" straddles the cut (its "c" is output), so it stays; "OPd" lies after it.
    assert deltas(events) == [("ab", ["ab"]), ("c", []), ("", ["cST"])]
    end = events[-1]
    assert isinstance(end, GenerationEnd) and end.finish_reason is FinishReason.STOP_SEQUENCE


async def test_a_token_that_starts_at_the_cut_is_dropped():
    events = await stop_events(["ab", "STOP", "cd"], ("STOP",))
    assert deltas(events) == [("ab", ["ab"])]


async def test_cut_inside_one_delta_keeps_that_deltas_tokens_with_the_text_before_it():
    events = await stop_events(["xySTOPz"], ("STOP",))
    assert deltas(events) == [("xy", ["xySTOPz"])]


async def test_every_token_is_emitted_once_when_nothing_matches():
    pieces = ["E", "N", "x", "E", "NE", "N", "D", "!"]
    events = await stop_events(pieces, ("ENDING",))
    assert "".join(text for text, _ in deltas(events)) == "".join(pieces)
    assert [t for _, tokens in deltas(events) for t in tokens] == pieces
