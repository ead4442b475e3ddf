"""Triton's error answers as inferwire's domain errors, from one table.

Triton says what went wrong in a status code and, for some cases, only in the message:
a restricted protocol, or a repository API that model-control mode does not allow. An
error inside a stream response carries no code at all, so streams are opened with the
`triton_grpc_error` header: Triton (2.47 and later) then ends the stream with the error's
own status code instead, and only errors raised before the model runs (an unknown model)
still arrive as messages. The first row that matches an answer decides its domain error;
anything unexpected is a `TritonError` (INTERNAL).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from inferwire.core.errors import (
    BackendCancelledError,
    BackendInvalidArgumentError,
    BackendUnavailableError,
    DeadlineExceededError,
    ModelNotFoundError,
    ModelNotReadyError,
)


class UnknownLoraError(ModelNotFoundError):
    """The vLLM backend does not know a request's `lora_name` (not in multi_lora.json)."""


class TritonError(RuntimeError):
    """An unexpected answer from Triton; reported to clients as INTERNAL, details logged."""


class Origin(enum.Enum):
    """What inferwire was doing when Triton answered with an error."""

    LOAD = enum.auto()  # making the model ready: ModelReady, RepositoryIndex, RepositoryModelLoad
    RPC = enum.auto()  # any other call: metadata, configuration, inference
    STREAM = enum.auto()  # an error message inside a ModelStreamInfer response; it has no code


@dataclass(frozen=True)
class Answer:
    """One error answer, with the names a message about it needs."""

    code: grpc.StatusCode  # UNKNOWN for an error inside a stream response
    details: str
    url: str  # the Triton endpoint that answered
    model: str  # our model name
    triton_model: str  # its name on Triton


@dataclass(frozen=True)
class _Row:
    """Answers during one of `origins`, with a code in `codes` (empty: any) and details
    containing one of `phrases` (empty: any), become `error(answer)`."""

    origins: frozenset[Origin]
    error: Callable[[Answer], Exception]
    codes: frozenset[grpc.StatusCode] = frozenset()
    phrases: tuple[str, ...] = ()

    def matches(self, answer: Answer, origin: Origin) -> bool:
        return (
            origin in self.origins
            and (not self.codes or answer.code in self.codes)
            and (not self.phrases or any(p in answer.details for p in self.phrases))
        )


def _unsupported(answer: Answer) -> Exception:
    return ModelNotReadyError(
        f"Triton at {answer.url} does not support this request for model {answer.model!r}: "
        f"{answer.details or 'unsupported'}"
    )


_ON_LOAD = frozenset({Origin.LOAD})
_ON_RPC = frozenset({Origin.RPC})
_ON_CALLS = _ON_LOAD | _ON_RPC
_IN_STREAM = frozenset({Origin.STREAM})

_TABLE: tuple[_Row, ...] = (
    # --grpc-restricted-protocol, and our request lacks the key: configuration.
    _Row(
        _ON_CALLS,
        lambda a: ModelNotReadyError(
            f"Triton at {a.url} refused model {a.model!r}: {a.details}; set options.headers"
        ),
        phrases=("protocol is restricted",),
    ),
    # The repository API answers this way outside --model-control-mode=explicit.
    _Row(
        _ON_LOAD,
        lambda a: ModelNotReadyError(
            f"model {a.triton_model!r} is not ready on Triton at {a.url}, and that server does "
            "not run with --model-control-mode=explicit, so inferwire cannot load it "
            f"({a.details})"
        ),
        phrases=("not allowed", "explicit"),
    ),
    _Row(
        _ON_CALLS,
        lambda a: BackendUnavailableError(
            f"Triton at {a.url} is unavailable for model {a.model!r}: {a.details}"
        ),
        codes=frozenset({grpc.StatusCode.UNAVAILABLE}),
    ),
    _Row(
        _ON_CALLS,
        lambda a: DeadlineExceededError(
            f"model {a.model!r} did not finish on Triton before the deadline"
        ),
        codes=frozenset({grpc.StatusCode.DEADLINE_EXCEEDED}),
    ),
    _Row(
        _ON_RPC,
        lambda a: ModelNotFoundError(
            a.model, f"Triton at {a.url}: {a.details or 'model not found'}"
        ),
        codes=frozenset({grpc.StatusCode.NOT_FOUND}),
    ),
    _Row(
        _ON_RPC,
        lambda a: BackendInvalidArgumentError(f"Triton: {a.details}"),
        codes=frozenset({grpc.StatusCode.INVALID_ARGUMENT}),
    ),
    # Triton's UNSUPPORTED (gRPC UNIMPLEMENTED): the model or server lacks a feature the
    # request needs, which Triton's message names; the request cannot succeed as sent.
    _Row(_ON_RPC, _unsupported, codes=frozenset({grpc.StatusCode.UNIMPLEMENTED})),
    # Triton (or the model) cancelled the request; ours are cancelled on our side first.
    _Row(
        _ON_RPC,
        lambda a: BackendCancelledError(f"Triton at {a.url} cancelled the request: {a.details}"),
        codes=frozenset({grpc.StatusCode.CANCELLED}),
    ),
    # The vLLM backend's words for a lora_name it was not started with.
    _Row(
        _ON_RPC | _IN_STREAM,
        lambda a: UnknownLoraError(a.model, f"Triton at {a.url}: {a.details}"),
        phrases=("is not supported, we currently support",),
    ),
    _Row(
        _ON_RPC,
        lambda a: TritonError(f"Triton at {a.url} answered {a.code.name}: {a.details}"),
    ),
    _Row(
        _ON_LOAD,
        lambda a: ModelNotReadyError(
            f"Triton at {a.url} failed to load model {a.triton_model!r}: {a.details}"
        ),
    ),
    # Without a code (a Triton before 2.47, or an error before the model ran), only
    # "unknown model" is certain.
    _Row(
        _IN_STREAM,
        lambda a: ModelNotFoundError(a.model, f"Triton: {a.details}"),
        phrases=("unknown model",),
    ),
    _Row(_IN_STREAM, lambda a: TritonError(f"Triton: {a.details}")),
)


def domain_error(answer: Answer, origin: Origin) -> Exception:
    """The domain error for Triton's answer: the first row of the table that matches."""
    return next(row for row in _TABLE if row.matches(answer, origin)).error(answer)


def rpc_error(
    exc: grpc.aio.AioRpcError, origin: Origin, *, url: str, model: str, triton_model: str
) -> Exception:
    """A failed call to Triton as a domain error."""
    answer = Answer(exc.code(), exc.details() or "", url, model, triton_model)
    return domain_error(answer, origin)


def stream_error(message: str, *, url: str, model: str, triton_model: str) -> Exception:
    """An error message inside a stream response as a domain error."""
    answer = Answer(grpc.StatusCode.UNKNOWN, message, url, model, triton_model)
    return domain_error(answer, Origin.STREAM)
