"""Domain objects passed between the servicer, the core and the backends."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class ModelState(enum.Enum):
    """Where a model is in its lifecycle."""

    UNLOADED = "UNLOADED"
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    FAILED = "FAILED"


class FinishReason(enum.Enum):
    """Why generation ended."""

    STOP = "STOP"  # end-of-sequence token
    STOP_SEQUENCE = "STOP_SEQUENCE"  # a request stop string matched
    LENGTH = "LENGTH"  # max_tokens or the context window reached
    TOOL_CALLS = "TOOL_CALLS"  # the output is tool calls (core/tools.py)


class Priority(enum.IntEnum):
    """Admission class; a lower value is admitted first (the proto's numbers)."""

    INTERACTIVE = 1
    STANDARD = 2
    BATCH = 3

    @property
    def label(self) -> str:
        return self.name.lower()


CHAT_ROLES = ("system", "user", "assistant", "tool")
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class ToolCall:
    """A call the model made: `arguments` is JSON text (valid under the tool's schema when
    the backend constrains calls)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A streamed piece of a call: the first of a call carries `id` and `name` (and no
    arguments), later ones only argument text; `index` counts the answer's calls."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass(frozen=True)
class Tool:
    """A function the model may call; `parameters` is its JSON Schema as JSON text."""

    name: str
    description: str = ""
    parameters: str = ""  # empty: no parameters (an object with none)
    strict: bool = False


class ToolChoiceMode(enum.Enum):
    NONE = "none"  # never call: the tools are not offered
    AUTO = "auto"  # text, or calls from the moment the model opens one
    REQUIRED = "required"  # calls only


class ToolSyntax(enum.Enum):
    """How a model writes its calls (core/tool_syntax.py detects it from the template)."""

    HERMES = "hermes"  # <tool_call>{"name": ..., "arguments": {...}}</tool_call>; the default
    LLAMA3_JSON = "llama3_json"  # [<|python_tag|>]{"name": ..., "parameters": {...}}
    MISTRAL = "mistral"  # [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]


@dataclass(frozen=True)
class ToolChoice:
    """`mode`, or one named function (`function` set: calls to it only)."""

    mode: ToolChoiceMode = ToolChoiceMode.AUTO
    function: str = ""


@dataclass(frozen=True)
class ChatMessage:
    """One turn of a conversation; the model's chat template renders them into a prompt."""

    role: str  # one of CHAT_ROLES
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant's calls
    tool_call_id: str = ""  # a `tool` message: the call it answers


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


@dataclass(frozen=True)
class Tokenization:
    """The tokens a model sees for a prompt, or for chat messages and what they rendered to."""

    token_ids: tuple[int, ...]
    rendered_prompt: str = ""  # for messages: the chat template's output


@dataclass(frozen=True)
class Capabilities:
    """What a loaded model can do; reported in ModelStatus."""

    streaming: bool
    max_concurrency: int
    on_premises: bool
    modalities: tuple[str, ...] = ("text",)
    context_length: int = 0
    max_output_tokens: int = 0
    chat: bool = False  # takes chat messages (has a chat template)
    logprobs: bool = False  # returns log-probabilities
    constrained_output: bool = False  # takes an output constraint
    tools: bool = False  # takes tools (calls parsed from its output)
    tools_constrained: bool = False  # its calls are constrained: valid by construction


@dataclass(frozen=True)
class PromptCacheStats:
    """What a backend that keeps finished requests' KV for reuse holds (llama-cpp's slots)."""

    cached_conversations: int  # free slots that hold a previous request's tokens
    cached_tokens: int
    cached_bytes: int
    prompt_tokens_total: int  # since load
    reused_tokens_total: int  # prompt tokens read from the cache, not computed

    @property
    def hit_rate(self) -> float:
        """Tokens reused / prompt tokens."""
        total = self.prompt_tokens_total
        return self.reused_tokens_total / total if total else 0.0


@dataclass(frozen=True)
class ModelLimits:
    """Limits a backend enforces on requests for a loaded model."""

    context_length: int  # 0: not known; the model enforces its own
    max_output_tokens: int
    max_seed: int | None = None  # the largest seed the engine takes, if it has a limit


@dataclass(frozen=True)
class ModelFacts:
    """What is fixed for a loaded model. `Backend.load` returns it, the core keeps it on the
    model until the model unloads, and no request asks the backend again (TGI's router
    reads its model's `Info` once, the same way)."""

    limits: ModelLimits
    capabilities: Capabilities  # `chat`: the model has a chat template
    default_max_tokens: int  # for requests that leave max_tokens unset
    context_separator: str  # joins context passages, and separates them from the prompt


@dataclass(frozen=True)
class BackendHealth:
    """Whether a backend's loaded model can serve right now, and why not."""

    healthy: bool
    detail: str = ""


@dataclass(frozen=True)
class ModelStatus:
    """A model's lifecycle state as ListModels, LoadModel and UnloadModel report it."""

    name: str
    backend: str
    state: ModelState
    detail: str = ""
    capabilities: Capabilities | None = None
    pinned: bool = False
    on_demand: bool = False
    resident_bytes: int = 0  # held against its device's budget (a Triton pool: 1)
    last_used: float | None = None  # time.time() of its last request (or load)
    base_model: str = ""  # an adapter model's base; empty for a base model
    # Changes with everything above but `last_used`, and is never the same for two
    # models: the api edge keeps the message it made of a status while this is unchanged.
    version: int = 0


@dataclass(frozen=True)
class ModelHealthReport:
    """A model's readiness and live counters, for the Health RPC."""

    name: str
    backend: str
    state: ModelState
    ready: bool
    detail: str
    inflight: int
    queued: int
    requests_total: int
    generated_tokens_total: int


@dataclass(frozen=True)
class Durations:
    """How many requests of a kind, and the seconds they took together."""

    count: int = 0
    total_s: float = 0.0


@dataclass(frozen=True)
class InferenceStatistics:
    """A model's inference requests since the server started, by how they ended."""

    name: str
    succeeded: Durations  # arrival to end, requests that finished generating
    failed: Durations  # arrival to end, every other request for the model
    queued: Durations  # arrival to admission, admitted requests
    computed: Durations  # admission to end, admitted requests
    last_inference_unix_ms: int = 0  # when the last request ended; 0: none yet


@dataclass(frozen=True)
class BackendHealthReport:
    """A backend's health over the models it serves."""

    name: str
    healthy: bool
    detail: str


@dataclass(frozen=True)
class HealthReport:
    """What the Health RPC answers: the server's readiness, models and backends."""

    serving: bool
    models: tuple[ModelHealthReport, ...]
    backends: tuple[BackendHealthReport, ...]
