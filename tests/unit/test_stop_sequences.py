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


def test_text_without_stops_passes_through_unchanged():
    emitted, matched = feed_all((), ["a", "b", "c"])
    assert not matched
    assert emitted == ["a", "b", "c", ""]
