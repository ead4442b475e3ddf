"""How a request is decoded: one record of its parameters (`GenerationParams`, the
contract's GenerationParameters), validated once here, and the constraint its output must
satisfy.

The sampling parameters proper (`SAMPLING_PARAMETERS`) are each taken by the backends that
declare them (`Capabilities.parameters`, which ListModels reports): the core refuses a
request that sets one its model's backend does not take, naming the field, so a backend
never silently ignores one. A new parameter is a field here, its check below, its name in
the declaring backends, and the two doors' converters.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from inferwire.core.errors import FieldViolation

MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 300  # entries (OpenAI's bound)
MAX_CHOICES = 16  # n


class ConstraintKind(enum.Enum):
    """What an output constraint is written in; the value is its request field's name."""

    JSON_SCHEMA = "json_schema"
    REGEX = "regex"
    LARK_GRAMMAR = "lark_grammar"


@dataclass(frozen=True)
class OutputConstraint:
    """Output the model must produce: JSON valid under a schema, a regex match, or a grammar."""

    kind: ConstraintKind
    text: str
    # Made from tools (core/tools.py): the field to name, and each tool's schema with its
    # field, so that a grammar the engine cannot compile is blamed on the tool at fault.
    origin: str = ""
    parts: tuple[tuple[str, str], ...] = ()

    @property
    def field(self) -> str:
        """The request field to name when the constraint is refused."""
        return self.origin or f"parameters.constraint.{self.kind.value}"


@dataclass(frozen=True)
class GenerationParams:
    """Decoding parameters; None means the model's default (`ModelFacts.sampling_defaults`
    fills it in before a backend sees the request, where the model has one)."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False  # return each generated token's log-probability
    top_logprobs: int = 0  # with logprobs: this many most likely alternatives per token
    constraint: OutputConstraint | None = None
    # At least this many tokens before the end-of-sequence token may end the output; 0 or
    # None: no minimum. Stop strings and the context window still end it earlier.
    min_tokens: int | None = None
    ignore_eos: bool = False  # never end on the end-of-sequence token: run to max_tokens
    presence_penalty: float | None = None  # OpenAI's: once per token already generated
    frequency_penalty: float | None = None  # OpenAI's: per occurrence in the output
    repetition_penalty: float | None = None  # CTRL's, on prompt and output tokens; 1: none
    logit_bias: Mapping[int, float] = field(default_factory=dict)  # token id -> added logit
    n: int | None = None  # choices to generate for the prompt; None or 1: one

    def parameters_set(self) -> tuple[str, ...]:
        """The sampling parameters this request sets (each one a backend must take), less
        those set to a value that changes nothing (`_NEUTRAL`)."""
        return tuple(
            name
            for name in SAMPLING_PARAMETERS
            if _is_set(value := getattr(self, name)) and value != _NEUTRAL.get(name)
        )


# The parameters a backend declares it takes; the rest of the record (max_tokens, stop,
# logprobs, the constraint) the core handles, or a capability of its own says.
SAMPLING_PARAMETERS = (
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "min_tokens",
    "ignore_eos",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "n",
)
# What a backend takes unless it says otherwise: what every backend took before backends
# declared their parameters.
BASE_PARAMETERS = frozenset(SAMPLING_PARAMETERS[:6])
# Values that change nothing (OpenAI's SDKs send them): every backend takes them.
_NEUTRAL: dict[str, object] = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "n": 1}


def _is_set(value: object) -> bool:
    return value is not None and value is not False and value != {}


def sampling_violations(params: GenerationParams) -> Iterator[FieldViolation]:
    """Every parameter out of its range (the model's own limits are checked later)."""
    if params.max_tokens is not None and params.max_tokens < 1:
        yield FieldViolation(
            "parameters.max_tokens", f"must be at least 1, got {params.max_tokens}"
        )
    if params.min_tokens is not None:
        if params.min_tokens < 0:
            yield FieldViolation(
                "parameters.min_tokens",
                f"must be >= 0 (0 means no minimum), got {params.min_tokens}",
            )
        elif (
            params.max_tokens is not None
            and params.max_tokens >= 1  # else max_tokens is the field to fix
            and params.min_tokens > params.max_tokens
        ):
            yield FieldViolation(
                "parameters.min_tokens",
                f"is {params.min_tokens}; it must not exceed parameters.max_tokens "
                f"({params.max_tokens})",
            )
    if params.temperature is not None and not (
        math.isfinite(params.temperature) and params.temperature >= 0
    ):
        yield FieldViolation(
            "parameters.temperature", f"must be finite and >= 0, got {params.temperature}"
        )
    if params.top_p is not None and not (0 < params.top_p <= 1):
        yield FieldViolation("parameters.top_p", f"must be in (0, 1], got {params.top_p}")
    if params.top_k is not None and params.top_k < 0:
        yield FieldViolation(
            "parameters.top_k", f"must be >= 0 (0 means no limit), got {params.top_k}"
        )
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(params, name)
        if value is not None and not (math.isfinite(value) and -2 <= value <= 2):
            yield FieldViolation(f"parameters.{name}", f"must be in [-2, 2], got {value}")
    penalty = params.repetition_penalty
    if penalty is not None and not (math.isfinite(penalty) and penalty > 0):
        yield FieldViolation(
            "parameters.repetition_penalty", f"must be finite and > 0 (1: none), got {penalty}"
        )
    yield from _logit_bias_violations(params.logit_bias)
    if params.n is not None and not 1 <= params.n <= MAX_CHOICES:
        yield FieldViolation("parameters.n", f"must be in 1..{MAX_CHOICES}, got {params.n}")
    if not 0 <= params.top_logprobs <= MAX_TOP_LOGPROBS:
        yield FieldViolation(
            "parameters.top_logprobs",
            f"must be in 0..{MAX_TOP_LOGPROBS}, got {params.top_logprobs}",
        )
    elif params.top_logprobs and not params.logprobs:
        yield FieldViolation("parameters.top_logprobs", "needs parameters.logprobs set to true")


def _logit_bias_violations(bias: Mapping[int, float]) -> Iterator[FieldViolation]:
    if len(bias) > MAX_LOGIT_BIAS:
        yield FieldViolation(
            "parameters.logit_bias", f"has {len(bias)} entries; at most {MAX_LOGIT_BIAS}"
        )
        return
    for token, value in bias.items():
        if token < 0:
            yield FieldViolation("parameters.logit_bias", f"token id {token} is negative")
        elif not (math.isfinite(value) and -100 <= value <= 100):
            yield FieldViolation(
                f"parameters.logit_bias[{token}]", f"must be in [-100, 100], got {value}"
            )
