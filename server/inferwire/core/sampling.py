"""How a request is decoded: its sampling parameters and the constraint its output must satisfy."""

from __future__ import annotations

import enum
from dataclasses import dataclass

MAX_TOP_LOGPROBS = 20


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
    """Decoding parameters; None means the model's default."""

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
