"""Reports a KV-cache gauge that requests set (see ../../README.md).

The gauge is TensorRT-LLM's: the family `nv_trt_llm_kv_cache_block_metrics`, labelled
`model`, `version` and `kv_cache_block_type` (`fraction`, `used`, `max`), as the
TensorRT-LLM backend exports it, made here with the Python backend's custom metrics API.
A prompt whose first word is `kv:<fraction>` sets it (`used` of 1000 `max` blocks with
it); every request answers the echo text at once, as trtllm_instant does.
"""

import numpy as np
import triton_python_backend_utils as pb_utils
from echo_engine import echo_text

FAMILY = "nv_trt_llm_kv_cache_block_metrics"
BLOCKS = 1000


def _scalar(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy().reshape(-1)[0]


class TritonPythonModel:
    def initialize(self, args):
        self.family = pb_utils.MetricFamily(
            name=FAMILY,
            description="TRT LLM KV cache block metrics",
            kind=pb_utils.MetricFamily.GAUGE,
        )
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.series = {
            kind: self.family.Metric(labels={**labels, "kv_cache_block_type": kind})
            for kind in ("fraction", "used", "max")
        }
        self.series["max"].set(BLOCKS)
        self._report(0.0)

    def _report(self, fraction):
        self.series["fraction"].set(fraction)
        self.series["used"].set(round(fraction * BLOCKS))

    def execute(self, requests):
        return [self._respond(request) for request in requests]

    def _respond(self, request):
        prompt = _scalar(request, "text_input").decode()
        words = prompt.split()
        if words and words[0].startswith("kv:"):
            self._report(float(words[0][3:]))
        max_tokens = int(_scalar(request, "max_tokens"))
        text = echo_text(prompt, min(max_tokens, 3 * max(1, len(words))))
        output = pb_utils.Tensor("text_output", np.array([[text.encode()]], dtype=np.object_))
        return pb_utils.InferenceResponse(output_tensors=[output])

    def finalize(self):
        # Each Metric before its MetricFamily, as the Python backend requires.
        self.series = {}
        self.family = None
