"""Log-probabilities from the vLLM backend's `logprobs` output.

With the input `return_logprobs` set and `logprobs: N` in `sampling_parameters`, each
response carries, per sequence, a JSON list with one entry for every token that response
adds: a dict from token id to `{"logprob", "rank", "decoded_token"}` holding the chosen
token first (vLLM puts the sampled token before the top N) and the N most likely tokens,
which may include the chosen one. `null` means vLLM computed none.
"""

from __future__ import annotations

import json
import math
from typing import Any

from tritonclient.grpc import InferResult

from inferwire.backends.triton.errors import TritonError
from inferwire.backends.triton.tensors import first_text
from inferwire.core.results import TokenLogprob, TopLogprob
from inferwire.wire.oip import LOGPROBS


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ValueError(f"logprob {value!r} is not a number")
    return float(value)


def _token(position: Any, top: int) -> TokenLogprob:
    if not isinstance(position, dict) or not position:
        raise ValueError("a token's entry is not a non-empty object")
    candidates = []
    for key, info in position.items():
        if not isinstance(info, dict):
            raise ValueError(f"token {key!r} has no logprob object")
        token = info.get("decoded_token")
        candidates.append(
            TopLogprob(
                token=token if isinstance(token, str) else "",
                token_id=int(key),
                logprob=_number(info.get("logprob")),
            )
        )
    chosen = candidates[0]
    # Most likely first; the sort is stable, so ties keep vLLM's order.
    ranked = sorted(candidates, key=lambda c: -c.logprob)[:top]
    return TokenLogprob(chosen.token, chosen.token_id, chosen.logprob, tuple(ranked))


def parse_logprobs(text: str, top: int) -> tuple[TokenLogprob, ...]:
    """The tokens one response adds, from one element of the `logprobs` output.

    `top`: how many alternatives the request asked for. Malformed JSON, or `null` when
    they were asked for, is the model's error (INTERNAL), never an empty list.
    """
    try:
        entries = json.loads(text)
        if entries is None:
            raise ValueError("the model returned null: it computed no log-probabilities")
        if not isinstance(entries, list):
            raise ValueError("not a JSON list")
        return tuple(_token(position, top) for position in entries)
    except ValueError as exc:  # json.JSONDecodeError and int() failures included
        raise TritonError(f"the model's {LOGPROBS!r} output is not vLLM's format: {exc}") from None


def response_logprobs(result: InferResult, top: int) -> tuple[TokenLogprob, ...]:
    """The log-probabilities of the tokens this response adds."""
    array = result.as_numpy(LOGPROBS)
    if array is None:
        raise TritonError(f"the model was asked for log-probabilities but sent no {LOGPROBS!r}")
    return parse_logprobs(first_text(array), top)
