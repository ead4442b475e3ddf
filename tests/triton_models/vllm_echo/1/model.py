"""A deterministic stand-in for Triton's vLLM backend (see ../../README.md).

It follows the vLLM backend's interface: `text_input`, `stream`, `sampling_parameters`
(JSON), `exclude_input_in_output` and the `return_*` flags, with `text_output`,
`finish_reason`, `logprobs`, `num_input_tokens` and `num_output_tokens` as outputs. Like older
releases of Triton's vLLM backend it streams cumulative text, and like vLLM it sends the final
flag with the last response. `num_output_tokens` counts the tokens of each response, and
`logprobs` (JSON, asked for with `return_logprobs` and `sampling_parameters.logprobs`) lists
the tokens of each response, as the vLLM backend does. `sampling_parameters.guided_decoding`
(json, regex or grammar) constrains the output; one it cannot follow is an INVALID_ARG error.
`sampling_parameters.min_tokens` delays its natural end, `ignore_eos` removes it.
`sampling_parameters.lora_name` picks a LoRA adapter from `multi_lora.json` beside this
file, as the vLLM backend does: adapter `x` answers as if each prompt word ended in `.x`;
an adapter the file does not name is refused in the vLLM backend's words.
"""

import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils
from echo_engine import (
    Generation,
    ThreadPerRequest,
    UnsupportedConstraint,
    check_requested_failure,
    token_delay_s,
    token_logprobs,
)

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _flag(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return bool(tensor.as_numpy().reshape(-1)[0]) if tensor is not None else False


class TritonPythonModel(ThreadPerRequest):
    def initialize(self, args):
        self.delay_s = token_delay_s()
        # The config parameter `stream_deltas: "true"` streams deltas, as current vLLM
        # backend releases do; without it, cumulative text.
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.deltas = parameters.get("stream_deltas", {}).get("string_value") == "true"
        # `load_delay_s`: a slow load, during which Triton's ServerReady is false.
        time.sleep(float(parameters.get("load_delay_s", {}).get("string_value", "0")))
        loras = os.path.join(args["model_repository"], args["model_version"], "multi_lora.json")
        self.supported_loras = []
        if os.path.isfile(loras):
            with open(loras) as file:
                self.supported_loras = list(json.load(file))

    def _fail(self, sender, message, code):
        error = pb_utils.TritonError(message, getattr(pb_utils.TritonError, code or "INTERNAL"))
        sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)

    def _generate(self, request, sender):
        prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
        prompt = prompt.reshape(-1)[0].decode()
        check_requested_failure(prompt)
        stream = _flag(request, "stream")
        params_tensor = pb_utils.get_input_tensor_by_name(request, "sampling_parameters")
        params = {}
        if params_tensor is not None:
            params = json.loads(params_tensor.as_numpy().reshape(-1)[0].decode() or "{}")
        stops = params.get("stop") or []
        stops = [stops] if isinstance(stops, str) else list(stops)
        include_stop = bool(params.get("include_stop_str_in_output", False))
        max_tokens = int(params.get("max_tokens", 16))
        lora_name = params.get("lora_name")
        if lora_name is not None:
            if lora_name not in self.supported_loras:
                message = (
                    f"LoRA {lora_name} is not supported, we currently support "
                    f"{self.supported_loras}"
                )
                self._fail(sender, message, None)
                return
            prompt = " ".join(f"{word}.{lora_name}" for word in prompt.split())
        prepend = not _flag(request, "exclude_input_in_output") and not stream
        try:
            generation = Generation(
                prompt,
                max_tokens,
                stops,
                include_stop,
                guided=params.get("guided_decoding"),
                min_tokens=int(params.get("min_tokens", 0)),
                ignore_eos=bool(params.get("ignore_eos", False)),
            )
        except (UnsupportedConstraint, ValueError, TypeError, KeyError) as exc:
            error = pb_utils.TritonError(
                f"guided_decoding: {exc}", pb_utils.TritonError.INVALID_ARG
            )
            sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
            return
        input_tokens = len(generation.words)
        flags = {
            name: _flag(request, f"return_{name}")
            for name in ("finish_reason", "logprobs", "num_input_tokens", "num_output_tokens")
        }
        top = params.get("logprobs")

        def logprobs(first, count):
            if top is None:
                return b"null"  # as vLLM: logprobs were not asked for in sampling_parameters
            pieces = generation.pieces[first : first + count]
            entries = [token_logprobs(p, first + i, int(top)) for i, p in enumerate(pieces)]
            return json.dumps(entries).encode()

        def response(text, new_tokens, finish):
            tensors = [pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_))]
            if flags["finish_reason"] and finish is not None:
                tensors.append(
                    pb_utils.Tensor("finish_reason", np.array([finish.encode()], dtype=np.object_))
                )
            if flags["logprobs"]:
                entries = logprobs(generation.tokens - new_tokens, new_tokens)
                tensors.append(pb_utils.Tensor("logprobs", np.array([entries], dtype=np.object_)))
            if flags["num_input_tokens"]:
                tensors.append(
                    pb_utils.Tensor("num_input_tokens", np.array([input_tokens], dtype=np.uint32))
                )
            if flags["num_output_tokens"]:
                tensors.append(
                    pb_utils.Tensor("num_output_tokens", np.array([new_tokens], dtype=np.uint32))
                )
            return pb_utils.InferenceResponse(output_tensors=tensors)

        sent_tokens = sent_chars = 0

        def streamed(text):  # what a stream response carries of the text so far
            return text[sent_chars:] if self.deltas else text

        for _ in generation.run(request.is_cancelled, self.delay_s):
            if stream and generation.finish is None:
                text = generation.text
                sender.send(response(streamed(text), generation.tokens - sent_tokens, None))
                sent_tokens, sent_chars = generation.tokens, len(text)
        forwarded = json.loads(request.parameters() or "{}")
        generation.record("vllm_echo", request.request_id(), stream, params, forwarded)
        text, tokens, finish = generation.text, generation.tokens, generation.finish
        if generation.cancelled:
            error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
            sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
        elif stream:
            # The last response carries the final flag, as the vLLM backend does.
            sender.send(response(streamed(text), tokens - sent_tokens, finish), FINAL)
        else:
            sender.send(response((prompt + text) if prepend else text, tokens, finish), FINAL)
