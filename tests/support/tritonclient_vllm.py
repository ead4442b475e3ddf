"""A tritonclient program written the way Triton's vLLM examples are, run unchanged against
a real tritonserver and against inferwire (tests/triton/test_kserve_tritonclient.py,
tests/engine/test_kserve.py).

    python tests/support/tritonclient_vllm.py HOST:PORT VLLM_MODEL TRTLLM_MODEL

VLLM_MODEL takes the vLLM backend's tensors (decoupled: streamed with
`async_stream_infer`); TRTLLM_MODEL is a non-decoupled model with a TensorRT-LLM
ensemble's tensors, called with `infer`. It drives `tritonclient.grpc` and then
`tritonclient.grpc.aio`, and prints one JSON object: what every call returned.
"""

from __future__ import annotations

import asyncio
import json
import queue
import sys
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient

PROMPTS = ("alpha beta gamma", "one two")
SAMPLING = {"max_tokens": 6, "temperature": 0}


def tensor(module: Any, name: str, value: np.ndarray, datatype: str) -> Any:
    inference_input = module.InferInput(name, list(value.shape), datatype)
    inference_input.set_data_from_numpy(value)
    return inference_input


def vllm_inputs(module: Any, prompt: str, stream: bool) -> list[Any]:
    inputs = [
        tensor(module, "text_input", np.array([prompt.encode()], dtype=np.object_), "BYTES"),
        tensor(module, "stream", np.array([stream], dtype=bool), "BOOL"),
        tensor(
            module,
            "sampling_parameters",
            np.array([json.dumps(SAMPLING).encode()], dtype=np.object_),
            "BYTES",
        ),
        tensor(module, "return_finish_reason", np.array([True], dtype=bool), "BOOL"),
    ]
    if stream:
        inputs.append(tensor(module, "exclude_input_in_output", np.array([True]), "BOOL"))
    return inputs


def trtllm_inputs(module: Any, prompt: str) -> list[Any]:
    return [
        tensor(module, "text_input", np.array([[prompt.encode()]], dtype=np.object_), "BYTES"),
        tensor(module, "max_tokens", np.array([[SAMPLING["max_tokens"]]], dtype=np.int32), "INT32"),
    ]


class Collected:
    """Responses of a stream, by request id, in arrival order."""

    def __init__(self) -> None:
        self.by_id: dict[str, dict[str, Any]] = {}

    def add(self, result: Any) -> None:
        response = result.get_response()
        entry = self.by_id.setdefault(
            response.id, {"pieces": [], "finish_reason": None, "finals": []}
        )
        text = result.as_numpy("text_output")
        if text is not None:
            entry["pieces"].append(b"".join(text.reshape(-1)).decode())
        finish = result.as_numpy("finish_reason")
        if finish is not None:
            entry["finish_reason"] = finish.reshape(-1)[0].decode()
        entry["finals"].append(response.parameters["triton_final_response"].bool_param)

    def summary(self) -> dict[str, Any]:
        return {
            request_id: {**entry, "text": "".join(entry["pieces"])}
            for request_id, entry in sorted(self.by_id.items())
        }


def run_sync(url: str, model: str, unary_model: str) -> dict[str, Any]:
    client = grpcclient.InferenceServerClient(url)
    out: dict[str, Any] = {
        "live": client.is_server_live(),
        "server_ready": client.is_server_ready(),
    }
    index = client.get_model_repository_index(as_json=True)
    out["index_has_models"] = {
        name: any(m["name"] == name for m in index.get("models", []))
        for name in (model, unary_model)
    }
    for name in (model, unary_model):
        client.load_model(name)
    out["model_ready"] = client.is_model_ready(model)
    metadata = client.get_model_metadata(model, as_json=True)
    out["metadata_inputs"] = sorted(i["name"] for i in metadata["inputs"])
    out["metadata_outputs"] = sorted(o["name"] for o in metadata["outputs"])
    config = client.get_model_config(model, as_json=True)["config"]
    out["decoupled"] = config.get("model_transaction_policy", {}).get("decoupled", False)

    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    for index_, prompt in enumerate(PROMPTS):
        client.async_stream_infer(
            model, vllm_inputs(grpcclient, prompt, True), request_id=f"s{index_}"
        )
    client.async_stream_infer(model, vllm_inputs(grpcclient, PROMPTS[0], False), request_id="whole")
    collected, errors = Collected(), []
    finals = 0
    while finals < len(PROMPTS) + 1:
        result, error = results.get(timeout=60)
        if error is not None:
            errors.append(str(error))
            finals += 1
            continue
        collected.add(result)
        finals += result.get_response().parameters["triton_final_response"].bool_param
    client.stop_stream()
    out["stream"], out["stream_errors"] = collected.summary(), errors

    result = client.infer(unary_model, trtllm_inputs(grpcclient, PROMPTS[1]))
    out["infer"] = result.as_numpy("text_output").reshape(-1)[0].decode()
    statistics = client.get_inference_statistics(model, as_json=True)
    out["statistics_success"] = int(
        statistics["model_stats"][0]["inference_stats"]["success"].get("count", 0)
    )
    client.unload_model(model)
    out["ready_after_unload"] = client.is_model_ready(model)
    client.load_model(model)
    out["ready_after_reload"] = client.is_model_ready(model)
    client.close()
    return out


async def run_aio(url: str, model: str, unary_model: str) -> dict[str, Any]:
    client = aioclient.InferenceServerClient(url)
    out: dict[str, Any] = {
        "server_ready": await client.is_server_ready(),
        "model_ready": await client.is_model_ready(model),
    }
    result = await client.infer(unary_model, trtllm_inputs(aioclient, PROMPTS[0]))
    out["infer"] = result.as_numpy("text_output").reshape(-1)[0].decode()

    async def requests() -> Any:
        for index, prompt in enumerate(PROMPTS):
            yield {
                "model_name": model,
                "inputs": vllm_inputs(aioclient, prompt, True),
                "request_id": f"a{index}",
            }

    collected, finals = Collected(), 0
    async for result, error in client.stream_infer(requests()):
        assert error is None, error
        collected.add(result)
        finals += result.get_response().parameters["triton_final_response"].bool_param
        if finals == len(PROMPTS):
            break
    out["stream"] = collected.summary()
    await client.close()
    return out


def main() -> None:
    url, model, unary_model = sys.argv[1:4]
    report = {
        "sync": run_sync(url, model, unary_model),
        "aio": asyncio.run(run_aio(url, model, unary_model)),
    }
    print(json.dumps(report, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
