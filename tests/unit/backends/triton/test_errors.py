"""Every row of the table from Triton's error answers to domain errors."""

import grpc
import pytest

pytest.importorskip("tritonclient.grpc")

from inferwire.backends.triton.errors import Origin, TritonError, rpc_error, stream_error
from inferwire.core import errors

URL = "triton-0:8001"
RESTRICTED = "This protocol is restricted, expecting header 'triton-grpc-protocol-key'"
CALLS = [Origin.LOAD, Origin.RPC]


def translate(origin: Origin, code: grpc.StatusCode, details: str) -> Exception:
    exc = grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)
    return rpc_error(exc, origin, url=URL, model="llama", triton_model="llama-3")


@pytest.mark.parametrize("origin", CALLS)
@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN])
def test_restricted_protocol_is_a_configuration_problem_whatever_the_code(origin, code):
    error = translate(origin, code, RESTRICTED)
    assert isinstance(error, errors.ModelNotReadyError)
    assert str(error) == f"Triton at {URL} refused model 'llama': {RESTRICTED}; set options.headers"


@pytest.mark.parametrize(
    "details",
    [
        "explicit model load / unload is not allowed if polling is enabled",
        "failed to load 'llama-3', explicit model control is off",
    ],
)
def test_loading_outside_explicit_mode_says_which_flag_is_missing(details):
    error = translate(Origin.LOAD, grpc.StatusCode.UNAVAILABLE, details)
    assert isinstance(error, errors.ModelNotReadyError)
    assert str(error) == (
        f"model 'llama-3' is not ready on Triton at {URL}, and that server does not run with "
        f"--model-control-mode=explicit, so inferwire cannot load it ({details})"
    )


@pytest.mark.parametrize("origin", CALLS)
def test_unreachable_triton_is_unavailable_while_loading_and_after(origin):
    error = translate(origin, grpc.StatusCode.UNAVAILABLE, "connection refused")
    assert isinstance(error, errors.BackendUnavailableError)
    assert str(error) == f"Triton at {URL} is unavailable for model 'llama': connection refused"


@pytest.mark.parametrize("origin", CALLS)
def test_deadline_exceeded_names_our_model(origin):
    error = translate(origin, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
    assert isinstance(error, errors.DeadlineExceededError)
    assert str(error) == "model 'llama' did not finish on Triton before the deadline"


def test_any_other_load_failure_leaves_the_model_not_ready():
    error = translate(Origin.LOAD, grpc.StatusCode.INTERNAL, "bad config.pbtxt")
    assert type(error) is errors.ModelNotReadyError
    assert str(error) == f"Triton at {URL} failed to load model 'llama-3': bad config.pbtxt"


@pytest.mark.parametrize(
    ("details", "message"),
    [("Request for unknown model", "Request for unknown model"), ("", "model not found")],
)
def test_not_found_is_our_model_not_found(details, message):
    error = translate(Origin.RPC, grpc.StatusCode.NOT_FOUND, details)
    assert isinstance(error, errors.ModelNotFoundError)
    assert error.model == "llama"
    assert str(error) == f"Triton at {URL}: {message}"


def test_invalid_argument_passes_tritons_reason_on():
    error = translate(Origin.RPC, grpc.StatusCode.INVALID_ARGUMENT, "unexpected shape [2]")
    assert isinstance(error, errors.BackendInvalidArgumentError)
    assert error.violations == []
    assert str(error) == "Triton: unexpected shape [2]"


@pytest.mark.parametrize("details", ["out of memory", "explicit"])
def test_any_other_answer_to_a_call_is_an_unexpected_triton_error(details):
    # The load rows ("explicit", "not allowed") do not apply outside loading.
    error = translate(Origin.RPC, grpc.StatusCode.RESOURCE_EXHAUSTED, details)
    assert type(error) is TritonError
    assert str(error) == f"Triton at {URL} answered RESOURCE_EXHAUSTED: {details}"


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("Request for unknown model: 'llama-3' is not found", errors.ModelNotFoundError),
        ("model crashed", TritonError),
        # A stream error has no code, and the phrases of the call rows do not apply.
        (RESTRICTED, TritonError),
    ],
)
def test_an_error_inside_a_stream_is_not_found_only_for_an_unknown_model(message, kind):
    error = stream_error(message, url=URL, model="llama", triton_model="llama-3")
    assert type(error) is kind
    assert str(error) == f"Triton: {message}"


def test_a_request_triton_cancelled_is_cancelled_not_internal():
    # ModelStreamInfer with the triton_grpc_error header ends with the model's own code.
    error = translate(Origin.RPC, grpc.StatusCode.CANCELLED, "cancelled by the model")
    assert isinstance(error, errors.BackendCancelledError)
    assert str(error) == f"Triton at {URL} cancelled the request: cancelled by the model"


def test_unsupported_is_a_failed_precondition_naming_what_triton_does_not_support():
    # Triton's UNSUPPORTED arrives as gRPC UNIMPLEMENTED; its message names the feature.
    details = "ModelInfer RPC doesn't support models with decoupled transaction policy"
    error = translate(Origin.RPC, grpc.StatusCode.UNIMPLEMENTED, details)
    assert type(error) is errors.ModelNotReadyError
    assert str(error) == (
        f"Triton at {URL} does not support this request for model 'llama': {details}"
    )
