"""Output constraints on the continuous path: llguidance's matchers, driven here.

ORT GenAI's generator applies llguidance inside its sampling step and hides the mask;
here each constrained row owns an `llguidance.LLMatcher` (JSON schema, regex or Lark: the
same grammars, in the same dialect, as the generator path took), whose mask of allowed
tokens is applied to the row's logits before anything else chooses from them, so a
constrained token's log-probability is that of the distribution it was drawn from.

The tokenizer llguidance reads is the folder's `tokenizer.json`, with the model's
vocabulary size and every end-of-sequence id: once the grammar is complete, those are the
tokens it allows, and any of them ends the row.
"""

from __future__ import annotations

import json
import re
from typing import Literal

import llguidance
import llguidance.numpy as llg_numpy
import numpy as np
import numpy.typing as npt

from inferwire.core.errors import FieldViolation, InvalidArgumentError
from inferwire.core.requests import GenerationRequest
from inferwire.core.sampling import ConstraintKind, OutputConstraint

Bitmask = npt.NDArray[np.int32]
_QUOTED_GRAMMAR = re.compile(r"\s*\d+ \|")  # where llguidance starts quoting the grammar
# llguidance's name for each kind (ORT GenAI's `set_guidance` took the kind's own value).
_FORMAT: dict[ConstraintKind, Literal["json_schema", "regex", "lark"]] = {
    ConstraintKind.JSON_SCHEMA: "json_schema",
    ConstraintKind.REGEX: "regex",
    ConstraintKind.LARK_GRAMMAR: "lark",
}


class Grammars:
    """One model's tokenizer as llguidance reads it, and the constraints compiled on it."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_ids: frozenset[int]) -> None:
        self.tokenizer = llguidance.LLTokenizer(
            tokenizer_json, n_vocab=vocab_size, eos_token=sorted(eos_ids)
        )
        self.vocab_size = vocab_size

    def matcher(self, constraint: OutputConstraint) -> llguidance.LLMatcher:
        """A matcher at the start of `constraint`; INVALID_ARGUMENT naming the field (or the
        tool whose schema is at fault) when llguidance cannot compile it."""
        grammar = llguidance.grammar_from(_FORMAT[constraint.kind], guidance_text(constraint))
        problem = self._problem(grammar)
        if problem is not None:
            field = self._part_at_fault(constraint) or constraint.field
            raise InvalidArgumentError([FieldViolation(field, problem)])
        return llguidance.LLMatcher(self.tokenizer, grammar)

    def _problem(self, grammar: str) -> str | None:
        error, warnings = llguidance.LLMatcher.validate_grammar_with_warnings(
            grammar, self.tokenizer
        )
        if not error:
            return None
        reason = "\n".join(warnings) if isinstance(warnings, list) else str(warnings)
        # llguidance's reason, less the grammar it quotes after it (`   1 | start: ...`).
        kept = []
        for line in reason.splitlines():
            if _QUOTED_GRAMMAR.match(line):
                break
            if line.strip() and line.strip() != "^":
                kept.append(line.strip())
        return "; ".join(kept) or "llguidance cannot compile it"

    def _part_at_fault(self, constraint: OutputConstraint) -> str:
        """The field of the first part (a tool's schema) that does not compile alone."""
        for field, schema in constraint.parts:
            grammar = llguidance.grammar_from("json_schema", schema)
            if self._problem(grammar) is not None:
                return field
        return ""

    def bitmask(self, rows: int) -> Bitmask:
        mask: Bitmask = llg_numpy.allocate_token_bitmask(rows, self.vocab_size)
        return mask


def guidance_text(constraint: OutputConstraint) -> str:
    """The text handed to llguidance: a JSON schema gets compact JSON
    (`x-guidance.whitespace_flexible: false`) unless it sets `x-guidance` itself, as on the
    generator path: with free whitespace, small models tend to write newlines forever."""
    if constraint.kind is not ConstraintKind.JSON_SCHEMA:
        return constraint.text
    try:
        schema = json.loads(constraint.text)
    except ValueError:
        return constraint.text  # llguidance says what is wrong with it
    if not isinstance(schema, dict) or "x-guidance" in schema:
        return constraint.text
    return json.dumps({"x-guidance": {"whitespace_flexible": False}, **schema})


def allowed(matcher: llguidance.LLMatcher, mask: Bitmask, row: int) -> None:
    """Row `row` of `mask`: the tokens `matcher` allows next."""
    llg_numpy.fill_next_token_bitmask(matcher, mask, row)


def apply_mask(scores: npt.NDArray[np.float32], mask: Bitmask, row: int) -> None:
    """Disallowed tokens' scores to -inf, in place (`scores`: one row's logits)."""
    llg_numpy.apply_token_bitmask_inplace(scores.reshape(1, -1), mask[row : row + 1])


def refuse_minimum_with_constraint(request: GenerationRequest, model: str) -> None:
    # llguidance ends a constrained output with the end-of-sequence token once the output
    # is complete, whatever min_length masks (measured on onnxruntime-genai 0.18: a regex
    # output ended after 9 tokens with min_length 20), so a minimum length cannot hold;
    # refused rather than silently not honoured.
    constraint = request.params.constraint
    if constraint is None or (field := minimum_field(request)) is None:
        return
    raise InvalidArgumentError(
        [
            FieldViolation(
                field,
                f"model {model!r} ends a constrained output when it is complete; it cannot "
                f"hold a minimum length ({constraint.field} is set)",
            )
        ]
    )


def minimum_field(request: GenerationRequest) -> str | None:
    """The field that asks for a minimum length, if any: ignore_eos, else min_tokens."""
    if request.params.ignore_eos:
        return "parameters.ignore_eos"
    if request.params.min_tokens:
        return "parameters.min_tokens"
    return None
