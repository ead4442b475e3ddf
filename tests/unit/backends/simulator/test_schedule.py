"""The simulator's words, seeds and schedule: pure functions, no server."""

from __future__ import annotations

from inferwire.backends.simulator.schedule import (
    VOCABULARY,
    Schedule,
    TokenPace,
    Words,
    natural_length,
    prompt_tokens,
    request_seed,
    token_ids,
)


def _text(seed: int, tokens: int) -> str:
    words = Words(seed)
    return "".join(words.next() for _ in range(tokens))


def test_every_token_is_one_vocabulary_word_after_a_space():
    text = _text(3, 200)
    assert text.count(" ") == 200
    assert set(text.split()) <= set(VOCABULARY)
    assert all(" " not in word and word for word in VOCABULARY)


def test_same_seed_same_words_and_other_seeds_differ():
    assert _text(11, 50) == _text(11, 50)
    assert _text(11, 50) != _text(12, 50)


def test_a_request_without_seed_is_seeded_by_its_prompt():
    assert request_seed(None, "Hello there") == request_seed(None, "Hello there")
    assert request_seed(None, "Hello there") != request_seed(None, "Hello here")
    assert request_seed(42, "Hello there") == 42


def test_prompt_tokens_and_token_ids_count_words():
    assert prompt_tokens("  one two\tthree\nfour ") == 4
    assert prompt_tokens("") == 0
    ids = token_ids("one two one")
    assert len(ids) == 3 and ids[0] == ids[2] != ids[1]


def test_schedule_is_absolute_from_the_start():
    schedule = Schedule(TokenPace(0.1, 0.02), start=5.0, seed=1)
    assert [round(schedule.due(i), 9) for i in range(4)] == [5.1, 5.12, 5.14, 5.16]


def test_jitter_is_deterministic_bounded_and_keeps_tokens_in_order():
    timing = TokenPace(0.0, 0.001, jitter_s=0.005)
    first = Schedule(timing, start=0.0, seed=9)
    again = Schedule(timing, start=0.0, seed=9)
    other = Schedule(timing, start=0.0, seed=10)
    dues = [first.due(i) for i in range(100)]
    assert dues == [again.due(i) for i in range(100)]
    assert dues != [other.due(i) for i in range(100)]
    assert dues == sorted(dues)
    for i, due in enumerate(dues):
        slot = i * 0.001
        assert due >= slot  # never early
        assert due < slot + 0.005 or due == dues[i - 1]  # late by the jitter, or by order


def test_natural_length_ends_by_itself_only_before_max_tokens():
    assert natural_length(None, 10) == (10, False)
    assert natural_length(4, 10) == (4, True)
    assert natural_length(10, 10) == (10, False)
    assert natural_length(30, 10) == (10, False)


def test_min_tokens_holds_the_natural_end_back_and_ignore_eos_runs_to_max_tokens():
    assert natural_length(4, 10, min_tokens=6) == (6, True)
    assert natural_length(4, 10, min_tokens=3) == (4, True)
    assert natural_length(4, 10, min_tokens=10) == (10, False)  # ignore_eos: min is max
    assert natural_length(None, 10, min_tokens=6) == (10, False)
