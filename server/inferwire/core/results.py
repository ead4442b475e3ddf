"""What a generation yields: deltas and its end from a backend, chunks and the result from the
core, with the tokens' log-probabilities, usage and timing."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from inferwire.core.chat import ToolCall, ToolCallDelta


class FinishReason(enum.Enum):
    """Why generation ended."""

    STOP = "STOP"  # end-of-sequence token
    STOP_SEQUENCE = "STOP_SEQUENCE"  # a request stop string matched
    LENGTH = "LENGTH"  # max_tokens or the context window reached
    TOOL_CALLS = "TOOL_CALLS"  # the output is tool calls (core/tools.py)


@dataclass(frozen=True)
class Usage:
    """Tokens a request used: its prompt's and those it generated."""

    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Timing:
    """Where a request's time went, in milliseconds from its arrival."""

    queue_ms: float
    time_to_first_token_ms: float
    total_ms: float
    load_ms: float = 0.0  # waited for the model to load (on demand); not in queue_ms


@dataclass(frozen=True)
class TopLogprob:
    """One of the most likely tokens at a position, with its log-probability."""

    token: str
    token_id: int
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token, its log-probability, and the most likely alternatives."""

    token: str
    token_id: int
    logprob: float
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True)
class TextDelta:
    """Text generated since the previous delta, with the running token count.

    `completion_tokens` is None from a backend that counts tokens only at the end.
    With `params.logprobs`, `logprobs` holds the tokens whose text this delta carries
    (a token whose text is still incomplete, such as part of a UTF-8 character, rides
    with the delta that completes it).
    """

    text: str
    completion_tokens: int | None
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class GenerationEnd:
    """The final event of a backend stream."""

    finish_reason: FinishReason
    usage: Usage
    stop_sequence: str = ""  # with STOP_SEQUENCE: the stop string that ended it


@dataclass(frozen=True)
class StreamChunk:
    """What the core yields to the servicer: a delta, and on the last chunk the outcome."""

    text: str
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    timing: Timing | None = None
    logprobs: tuple[TokenLogprob, ...] = ()
    tokens: int | None = None  # generated so far, when the backend reports a running count
    tool_calls: tuple[ToolCallDelta, ...] = ()
    # With n choices (core/choices.py): the choice this chunk belongs to. A choice's end is
    # a chunk with its finish_reason; the stream's last chunk is the one with `usage`.
    choice: int = 0
    stop_sequence: str = ""  # on a choice's end by STOP_SEQUENCE: which stop string


@dataclass(frozen=True)
class Choice:
    """One of a request's n answers (OpenAI's `choices[i]`)."""

    index: int
    text: str
    finish_reason: FinishReason
    logprobs: tuple[TokenLogprob, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    stop_sequence: str = ""  # with STOP_SEQUENCE: the stop string that ended it


@dataclass(frozen=True)
class InferenceResult:
    request_id: str
    model: str
    backend: str
    text: str
    finish_reason: FinishReason
    usage: Usage
    timing: Timing
    logprobs: tuple[TokenLogprob, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    # With n > 1, every choice (the fields above are choice 0's); empty otherwise.
    choices: tuple[Choice, ...] = ()
    stop_sequence: str = ""  # with STOP_SEQUENCE: the stop string that ended choice 0


@dataclass(frozen=True)
class Tokenization:
    """The tokens a model sees for a prompt, or for chat messages and what they rendered to."""

    token_ids: tuple[int, ...]
    rendered_prompt: str = ""  # for messages: the chat template's output
