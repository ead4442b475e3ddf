"""The KServe Python SDK's gRPC client against a server, run in the SDK's own virtualenv
(tests.support.kserve_sdk): `python kserve_sdk_client.py HOST:PORT MODEL`. Prints JSON."""

from __future__ import annotations

import asyncio
import json
import sys

import numpy as np
from kserve import InferenceGRPCClient, InferInput, InferRequest


async def main(url: str, model: str) -> None:
    client = InferenceGRPCClient(url, timeout=60)
    text = InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"Hello"], dtype=np.object_))
    request = InferRequest(
        model_name=model,
        infer_inputs=[text],
        request_id="kserve-sdk-1",
        # The KServe way: generation parameters as request parameters.
        parameters={"max_tokens": 8, "temperature": "0"},
    )
    report = {
        "server_live": await client.is_server_live(),
        "server_ready": await client.is_server_ready(),
        "model_ready": await client.is_model_ready(model),
        "missing_model_ready": await client.is_model_ready("no-such-model"),
    }
    response = await client.infer(request)
    outputs = {output.name: output.as_numpy().reshape(-1).tolist() for output in response.outputs}
    report |= {
        "id": response.id,
        "model_name": response.model_name,
        "text_output": [value.decode() for value in outputs["text_output"]],
    }
    await client.close()
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
