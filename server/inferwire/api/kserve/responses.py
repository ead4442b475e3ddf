"""The core's results as ModelInferResponses of the vLLM convention."""

from __future__ import annotations

from tritonclient.grpc import service_pb2 as oip

from inferwire.api.kserve.conventions import ParsedRequest
from inferwire.api.kserve.tensors import Output, bytes_output, infer_response, uint32_output
from inferwire.core.results import FinishReason, InferenceResult, StreamChunk
from inferwire.wire.oip import (
    FINISH_LENGTH,
    FINISH_REASON,
    FINISH_STOP,
    NUM_INPUT_TOKENS,
    NUM_OUTPUT_TOKENS,
    TEXT_OUTPUT,
)

# Why generation ended, in vLLM's words.
_VLLM_FINISH_REASON = {
    FinishReason.STOP: FINISH_STOP,
    FinishReason.STOP_SEQUENCE: FINISH_STOP,
    FinishReason.LENGTH: FINISH_LENGTH,
}


def result_response(
    parsed: ParsedRequest, result: InferenceResult, final: bool | None = None
) -> oip.ModelInferResponse:
    """The one response to a request that was not streamed: the whole text."""
    text = parsed.prefix + result.text
    usage = result.usage
    outputs = _outputs(
        parsed, text, result.finish_reason, usage.prompt_tokens, usage.completion_tokens
    )
    return infer_response(parsed.inference.model, parsed.inference.request_id, outputs, final)


class ChunkResponses:
    """A streamed request's responses, one per chunk; the last one says it is final.

    `num_output_tokens` counts the tokens of each response, as the vLLM backend does;
    from a backend that counts only at the end, the last response carries them all.
    """

    def __init__(self, parsed: ParsedRequest) -> None:
        self._parsed = parsed
        self._tokens_sent = 0

    def response(self, chunk: StreamChunk) -> oip.ModelInferResponse:
        final = chunk.finish_reason is not None
        counted = chunk.usage.completion_tokens if chunk.usage is not None else chunk.tokens
        new_tokens = None
        if counted is not None:
            new_tokens, self._tokens_sent = counted - self._tokens_sent, counted
        prompt_tokens = chunk.usage.prompt_tokens if chunk.usage is not None else None
        outputs = _outputs(self._parsed, chunk.text, chunk.finish_reason, prompt_tokens, new_tokens)
        inference = self._parsed.inference
        return infer_response(inference.model, inference.request_id, outputs, final)


def _outputs(
    parsed: ParsedRequest,
    text: str,
    finish: FinishReason | None,
    prompt_tokens: int | None,
    new_tokens: int | None,
) -> list[Output]:
    """The outputs the request gets, of those known at this point."""
    wanted = parsed.outputs
    outputs = []
    if TEXT_OUTPUT in wanted:
        outputs.append(bytes_output(TEXT_OUTPUT, [text.encode()], parsed.text_shape))
    if FINISH_REASON in wanted and finish is not None:
        reason = _VLLM_FINISH_REASON[finish].encode()
        outputs.append(bytes_output(FINISH_REASON, [reason], (1,)))
    if NUM_INPUT_TOKENS in wanted and prompt_tokens is not None:
        outputs.append(uint32_output(NUM_INPUT_TOKENS, prompt_tokens))
    if NUM_OUTPUT_TOKENS in wanted and new_tokens is not None:
        outputs.append(uint32_output(NUM_OUTPUT_TOKENS, new_tokens))
    return outputs
