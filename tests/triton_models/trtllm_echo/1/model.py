"""A deterministic stand-in for a TensorRT-LLM ensemble (see ../../README.md).

It follows the ensemble's interface: `text_input`, `max_tokens` (INT32), `stream` and the
optional sampling tensors (`temperature`, `top_p`, `top_k`, `random_seed`, `stop_words`),
with `text_output` as the only output, and a batch dimension. It streams deltas, keeps a
stop word in the output (as TensorRT-LLM does), and ends a stream with an empty final
response. The same code serves `trtllm_unary`, a non-decoupled copy (config only).
Prompts over MAX_PROMPT_WORDS words are refused with INVALID_ARG, as an engine refuses
prompts longer than its context window.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils
from echo_engine import Generation, ThreadPerRequest, check_requested_failure, token_delay_s

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
OPTIONAL_SCALARS = ("temperature", "top_p", "top_k", "random_seed")
MAX_PROMPT_WORDS = 1000


def _scalar(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    value = tensor.as_numpy().reshape(-1)[0]
    return value if isinstance(value, bytes) else value.item()


def _text_tensor(text):
    return pb_utils.Tensor("text_output", np.array([[text.encode()]], dtype=np.object_))


class TritonPythonModel(ThreadPerRequest):
    def initialize(self, args):
        self.delay_s = token_delay_s()
        self.name = args["model_name"]
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)

    def execute(self, requests):
        if not self.decoupled:
            return [self._respond(request) for request in requests]
        return super().execute(requests)

    def _respond(self, request):
        """Non-decoupled: one response per request, returned from execute."""
        responses = []

        class Collector:
            def send(self, response=None, flags=0):
                if response is not None:
                    responses.append(response)

        try:
            self._generate(request, Collector())
        except Exception as exc:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
        return responses[-1]

    def _fail(self, sender, message, code):
        error = pb_utils.TritonError(message, getattr(pb_utils.TritonError, code or "INTERNAL"))
        sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)

    def _generate(self, request, sender):
        prompt = _scalar(request, "text_input").decode()
        check_requested_failure(prompt)
        max_tokens = int(_scalar(request, "max_tokens"))
        stream = bool(_scalar(request, "stream"))
        exclude_input = bool(_scalar(request, "exclude_input_in_output"))
        stop_tensor = pb_utils.get_input_tensor_by_name(request, "stop_words")
        stops = []
        if stop_tensor is not None:
            stops = [s.decode() for s in stop_tensor.as_numpy().reshape(-1) if s]
        # TensorRT-LLM keeps the stop word in its output.
        generation = Generation(prompt, max_tokens, stops, include_stop=True)
        words = len(generation.words)
        if words > MAX_PROMPT_WORDS:
            error = pb_utils.TritonError(
                f"the prompt has {words} words; {self.name} takes at most {MAX_PROMPT_WORDS}",
                pb_utils.TritonError.INVALID_ARG,
            )
            sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
            return

        for delta in generation.run(request.is_cancelled, self.delay_s):
            if stream and delta:
                sender.send(pb_utils.InferenceResponse(output_tensors=[_text_tensor(delta)]))
        generation.record(
            self.name,
            request.request_id(),
            stream,
            {
                "max_tokens": max_tokens,
                "stop": stops,
                **{name: _scalar(request, name) for name in OPTIONAL_SCALARS},
            },
        )
        if generation.cancelled:
            error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
            sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
        elif stream:
            sender.send(flags=FINAL)
        else:
            full = generation.text if exclude_input else prompt + generation.text
            sender.send(pb_utils.InferenceResponse(output_tensors=[_text_tensor(full)]), FINAL)
