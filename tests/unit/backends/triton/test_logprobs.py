"""Log-probabilities in the vLLM backend's `logprobs` output format."""

import json

import pytest

pytest.importorskip("tritonclient.grpc")

from inferwire.backends.triton.errors import TritonError
from inferwire.backends.triton.logprobs import parse_logprobs


def entry(*tokens: tuple[int, float, int, str]) -> dict:
    return {
        str(i): {"logprob": lp, "rank": rank, "decoded_token": text} for i, lp, rank, text in tokens
    }


def test_each_entry_is_the_chosen_token_first_with_the_most_likely_as_top():
    text = json.dumps(
        [
            entry((7, -0.1, 1, "Hel"), (9, -2.5, 2, "He")),
            # Sampled (not greedy): the chosen token is not the most likely.
            entry((4, -3.0, 3, "lo"), (5, -0.2, 1, "p"), (6, -1.0, 2, "ium")),
        ]
    )
    first, second = parse_logprobs(text, top=2)
    assert (first.token, first.token_id, first.logprob) == ("Hel", 7, -0.1)
    assert [(t.token, t.logprob) for t in first.top] == [("Hel", -0.1), ("He", -2.5)]
    assert (second.token, second.token_id, second.logprob) == ("lo", 4, -3.0)
    assert [t.token_id for t in second.top] == [5, 6]  # the chosen one is not among the top 2


def test_top_zero_keeps_only_the_chosen_tokens():
    (only,) = parse_logprobs(json.dumps([entry((3, -0.5, 1, "a"), (8, -1.5, 2, "b"))]), top=0)
    assert (only.token_id, only.top) == (3, ())


def test_missing_decoded_text_is_an_empty_token():
    (only,) = parse_logprobs(json.dumps([{"12": {"logprob": -0.3, "rank": 1}}]), top=1)
    assert (only.token, only.top[0].token) == ("", "")


def test_a_response_without_new_tokens_has_an_empty_list():
    assert parse_logprobs("[]", top=3) == ()


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("null", "computed no log-probabilities"),
        ("{not json", "Expecting property name"),
        ('{"1": {}}', "not a JSON list"),
        ("[{}]", "non-empty object"),
        ('[{"x": {"logprob": -1}}]', "invalid literal"),
        ('[{"1": {"logprob": "high"}}]', "is not a number"),
        ('[{"1": 0.5}]', "no logprob object"),
    ],
)
def test_anything_else_is_the_models_error(text, reason):
    with pytest.raises(TritonError) as raised:
        parse_logprobs(text, top=1)
    assert "not vLLM's format" in str(raised.value)
    assert reason in str(raised.value)
