"""The trivial TensorRT-LLM-style model (see ../../README.md): the echo text at once.

No per-token loop, no cancellation checks (each is a round trip to Triton), no record:
the benchmarks use it so that the callers and the gateway, not the model, are measured.
"""

import numpy as np
import triton_python_backend_utils as pb_utils
from echo_engine import echo_text


def _scalar(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy().reshape(-1)[0]


class TritonPythonModel:
    def execute(self, requests):
        return [self._respond(request) for request in requests]

    def _respond(self, request):
        prompt = _scalar(request, "text_input").decode()
        max_tokens = int(_scalar(request, "max_tokens"))
        # Generation ends at max_tokens or after three times the prompt's words.
        text = echo_text(prompt, min(max_tokens, 3 * max(1, len(prompt.split()))))
        if not _scalar(request, "exclude_input_in_output"):
            text = prompt + text
        output = pb_utils.Tensor("text_output", np.array([[text.encode()]], dtype=np.object_))
        return pb_utils.InferenceResponse(output_tensors=[output])
