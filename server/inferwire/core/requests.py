"""A generation request as it reaches the core (`InferenceRequest`), and as a backend runs it
(`GenerationRequest`), with the admission class it asks for."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from inferwire.core.chat import ChatMessage, Tool, ToolChoice, ToolSyntax
from inferwire.core.sampling import GenerationParams


class Priority(enum.IntEnum):
    """Admission class; a lower value is admitted first (the proto's numbers)."""

    INTERACTIVE = 1
    STANDARD = 2
    BATCH = 3

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class InferenceRequest:
    """One generation request, already validated for shape (not for model limits)."""

    request_id: str
    model: str
    prompt: str
    context: tuple[str, ...] = ()
    params: GenerationParams = field(default_factory=GenerationParams)
    deadline: float | None = None  # time.monotonic() by which the caller needs the result
    messages: tuple[ChatMessage, ...] = ()  # the alternative to `prompt`
    tenant: str = ""  # whose request it is (core/tenants.py); "" when tenants are off
    priority: Priority | None = None  # the priority it asks for; None: its tenant's
    # A priority the inference gateway asked for on the caller's behalf (its objective): taken up to
    # the tenant's own, never above it (core/tenants.py).
    priority_hint: Priority | None = None
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice | None = None  # None: auto with tools
    parallel_tool_calls: bool = True  # False: at most one call


@dataclass(frozen=True)
class GenerationRequest:
    """What a backend runs: a validated request with its prompt rendered and limits applied.

    `params.stop` is passed on as a hint for engines that can stop by themselves;
    the core matches stop strings in the output either way.
    """

    request_id: str
    prompt: str  # the text the model sees: context passages, then the prompt
    max_tokens: int  # resolved against the model's default and limit
    params: GenerationParams = field(default_factory=GenerationParams)
    deadline: float | None = None  # time.monotonic() by which the caller needs the result
    has_context: bool = False  # whether `prompt` includes context passages
    is_chat: bool = False  # whether `prompt` is chat messages rendered by the chat template
    # It holds a reserved slot (core/reserve.py): a backend that batches starts it without
    # waiting for the running batch to finish.
    reserved: bool = False
    # The tools the model may call: the core reads their calls out of the output
    # (core/tool_calls.py), under `params.constraint` where the backend constrains them.
    tools: tuple[Tool, ...] = ()
    tool_syntax: ToolSyntax = ToolSyntax.HERMES  # the syntax its calls are written in

    @property
    def min_tokens(self) -> int:
        """Tokens to generate before the end-of-sequence token may end the output: all of
        max_tokens with `ignore_eos`, else `params.min_tokens` (0: no minimum). A backend
        that bounds generation further (the context window) bounds this too."""
        if self.params.ignore_eos:
            return self.max_tokens
        return min(self.params.min_tokens or 0, self.max_tokens)

    @property
    def prompt_field(self) -> str:
        """The request field to name when the rendered prompt is refused."""
        if self.is_chat:
            return "messages"
        return "context" if self.has_context else "prompt"
