"""What the KServe v2 service says about the server and its models: metadata, the model
configuration, statistics and the repository index, from the core's state."""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as config_pb
from tritonclient.grpc import service_pb2 as oip

from inferwire import __version__
from inferwire.api.kserve.conventions import ACCEPTED_VLLM_INPUTS, SERVED_OUTPUTS
from inferwire.api.kserve.tensors import MODEL_VERSION
from inferwire.core.facts import Capabilities
from inferwire.core.status import InferenceStatistics, ModelState, ModelStatus
from inferwire.wire.oip import FINISH_REASON, TEXT_INPUT, TEXT_OUTPUT

SERVER_NAME = "inferwire"
# The protocol extensions this service implements (Triton's names).
EXTENSIONS = ("model_repository", "model_configuration", "statistics", "parameters")
# Inputs and outputs have one element, or any number (-1), as in the vLLM backend's config.
_INPUT_DIMS = (1,)
_OUTPUT_DIMS = {TEXT_OUTPUT: (-1,), FINISH_REASON: (-1,)}
_CONFIG_TYPE = {"BYTES": "TYPE_STRING"}
# Triton's repository states; an unloaded model has none, as a model Triton never loaded.
_INDEX_STATE = {
    ModelState.READY: "READY",
    ModelState.LOADING: "LOADING",
    ModelState.UNLOADING: "UNLOADING",
    ModelState.FAILED: "UNAVAILABLE",
}


def server_metadata() -> oip.ServerMetadataResponse:
    return oip.ServerMetadataResponse(
        name=SERVER_NAME, version=__version__, extensions=list(EXTENSIONS)
    )


def model_metadata(status: ModelStatus) -> oip.ModelMetadataResponse:
    tensor = oip.ModelMetadataResponse.TensorMetadata
    return oip.ModelMetadataResponse(
        name=status.name,
        versions=[MODEL_VERSION],
        platform=f"{SERVER_NAME}_{status.backend}",
        inputs=[
            tensor(name=n, datatype=t, shape=_INPUT_DIMS) for n, t in ACCEPTED_VLLM_INPUTS.items()
        ],
        outputs=[
            tensor(name=n, datatype=t, shape=_OUTPUT_DIMS.get(n, (1,)))
            for n, t in SERVED_OUTPUTS.items()
        ],
    )


def model_config(status: ModelStatus, capabilities: Capabilities) -> oip.ModelConfigResponse:
    """The model as a Triton model configuration: `decoupled` when it streams."""

    def data_type(datatype: str) -> int:
        return config_pb.DataType.Value(_CONFIG_TYPE.get(datatype, f"TYPE_{datatype}"))

    config = config_pb.ModelConfig(
        name=status.name,
        platform=f"{SERVER_NAME}_{status.backend}",
        backend=status.backend,
        max_batch_size=0,
        input=[
            config_pb.ModelInput(
                name=name,
                data_type=data_type(datatype),
                dims=_INPUT_DIMS,
                optional=name != TEXT_INPUT,
            )
            for name, datatype in ACCEPTED_VLLM_INPUTS.items()
        ],
        output=[
            config_pb.ModelOutput(
                name=name, data_type=data_type(datatype), dims=_OUTPUT_DIMS.get(name, (1,))
            )
            for name, datatype in SERVED_OUTPUTS.items()
        ],
        model_transaction_policy=config_pb.ModelTransactionPolicy(decoupled=capabilities.streaming),
    )
    for key, value in (
        ("max_concurrency", capabilities.max_concurrency),
        ("context_length", capabilities.context_length),
        ("max_output_tokens", capabilities.max_output_tokens),
    ):
        config.parameters[key].string_value = str(value)
    return oip.ModelConfigResponse(config=config)


def model_statistics(statistics: InferenceStatistics) -> oip.ModelStatistics:
    def duration(count: int, seconds: float) -> oip.StatisticDuration:
        return oip.StatisticDuration(count=count, ns=round(seconds * 1e9))

    s = statistics
    return oip.ModelStatistics(
        name=s.name,
        version=MODEL_VERSION,
        last_inference=s.last_inference_unix_ms,
        inference_count=s.succeeded.count,
        execution_count=s.computed.count,
        inference_stats=oip.InferStatistics(
            success=duration(s.succeeded.count, s.succeeded.total_s),
            fail=duration(s.failed.count, s.failed.total_s),
            queue=duration(s.queued.count, s.queued.total_s),
            compute_infer=duration(s.computed.count, s.computed.total_s),
        ),
    )


def index_entry(status: ModelStatus) -> oip.RepositoryIndexResponse.ModelIndex:
    state = _INDEX_STATE.get(status.state, "")
    return oip.RepositoryIndexResponse.ModelIndex(
        name=status.name,
        version=MODEL_VERSION if state else "",
        state=state,
        reason=status.detail if state and state != "READY" else "",
    )
