"""The NVIDIA Triton Inference Server backend.

Talks to one or more `tritonserver` processes over Triton's gRPC protocol, with the
async stubs and result helpers that `tritonclient.grpc` ships, on `grpc.aio` channels:
nothing blocks the event loop. `tritonclient.grpc.aio.InferenceServerClient` itself is
not used because its `stream_infer` refuses every `triton_*` request parameter, and
decoupled streaming needs `triton_enable_empty_final_response`.

- The input convention (vLLM backend or TensorRT-LLM ensemble) is detected from the
  model's metadata at load time; a model matching neither is refused.
- Streams use ModelStreamInfer and end on `triton_final_response`. Models that stream
  cumulative text are turned into deltas.
- Closing a stream (our client cancelled, or its deadline passed) cancels the Triton
  call, which cancels the request inside Triton. Our client's deadline, less a margin,
  is the Triton call's deadline and the request's `timeout` parameter.
- Several endpoints: each has its own channel; requests go round-robin over the ones
  that passed the last health check and whose channel is not failing. A request that
  fails to reach an endpoint before any response moves on to the next one.

Modules, by concern: `options` (the `options` keys), `backend` (lifecycle, health and
the generation loop), `model_control` (loading and unloading the model on the endpoints,
and the periodic endpoint check that loads it again where it was lost), `endpoints`
(channels, health, round-robin, failover), `discovery` (endpoints from DNS),
`kv_metrics` (the Triton servers' KV-cache gauges, from their metrics ports),
`conventions` (detection and request building per convention), `tensors` (input
encoding, output decoding), `streaming` (deltas from cumulative text), `model_text`
(the model's tokenizer and chat template, held in inferwire), `chat` (chat templates),
`logprobs` (log-probabilities from the outputs), `tasks` (stopping background
tasks), `errors` (Triton's answers as domain errors). The protocol's tensor names and
codec, shared with the KServe service, are inferwire.wire.oip's.
"""

from inferwire.backends.triton.backend import TritonBackend
from inferwire.backends.triton.options import TritonOptions

__all__ = ["TritonBackend", "TritonOptions"]
