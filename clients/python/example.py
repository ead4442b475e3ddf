"""inferwire from Python: Infer, InferStream, a health check, reading a
BadRequest, and a chat request with log-probabilities. The unary Infer waits out a
RESOURCE_EXHAUSTED as long as its google.rpc.RetryInfo asks (a tenant quota), then
tries again. Uses only the generated
stubs in `inferwire.v1` plus grpcio's own packages (grpc_health, grpc_status and
googleapis' google.rpc types).

    python clients/python/example.py [--lb round_robin] [HOST:PORT] [MODEL]

--lb picks a load-balancing policy: with a `dns:///host:port` target, round_robin
spreads calls over every address of the name (one per replica behind a headless
Service).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import TypeVar

import grpc
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc

# The chat request every language's example sends: greedy, so that the tokens and their
# log-probabilities are the same from every client.
CHAT_SYSTEM = "You are a player in a Shakespeare play."
CHAT_USER = "Good morrow! What news from Verona?"
TOP_LOGPROBS = 3

T = TypeVar("T")


def retry_after_s(error: grpc.RpcError) -> float | None:
    """How long a RESOURCE_EXHAUSTED's google.rpc.RetryInfo asks to wait (a tenant
    quota, or memory that cannot be freed yet); None for any other error."""
    if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    status_proto = rpc_status.from_call(error)
    for detail in status_proto.details if status_proto else []:
        retry_info = error_details_pb2.RetryInfo()
        if detail.Unpack(retry_info):
            return retry_info.retry_delay.ToNanoseconds() / 1e9
    return None


def with_quota_retries(call: Callable[[], T], attempts: int = 3) -> T:
    """`call()`, and again after each wait a RetryInfo asks for, at most `attempts` times."""
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except grpc.RpcError as error:
            delay = retry_after_s(error)
            if delay is None or attempt == attempts:
                raise
            print(f"RETRY after={delay:.3f}s", flush=True)
            time.sleep(delay)
    raise AssertionError("unreachable")


def main(target: str = "localhost:50051", model: str = "demo", lb: str = "") -> None:
    options = []
    if lb:
        config = {"loadBalancingConfig": [{lb: {}}]}
        options.append(("grpc.service_config", json.dumps(config)))
    with grpc.insecure_channel(target, options=options) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)

        # 1. Unary Infer, waiting out a quota's RESOURCE_EXHAUSTED as its RetryInfo asks.
        request = pb.InferRequest(
            model=model, prompt="ROMEO:", parameters=pb.GenerationParameters(max_tokens=16)
        )
        response = with_quota_retries(lambda: stub.Infer(request, timeout=30))
        print("INFER", json.dumps(response.text))

        # 2. InferStream: print each delta as it arrives; the last message has finish_reason.
        deltas = 0
        finish_reason = pb.FINISH_REASON_UNSPECIFIED
        stream = stub.InferStream(
            pb.InferStreamRequest(
                model=model, prompt="ROMEO:", parameters=pb.GenerationParameters(max_tokens=24)
            ),
            timeout=30,
        )
        for message in stream:
            if message.text:
                deltas += 1
                print("DELTA", json.dumps(message.text), flush=True)
            finish_reason = message.finish_reason or finish_reason
        print(f"STREAM_END finish_reason={pb.FinishReason.Name(finish_reason)} deltas={deltas}")

        # 3. The standard health service, as probes see it.
        health = health_pb2_grpc.HealthStub(channel)
        check = health.Check(health_pb2.HealthCheckRequest(service=f"model/{model}"), timeout=5)
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(check.status)
        print(f"HEALTH model/{model} {status}")

        # 4. A bad request: the status code, plus google.rpc.BadRequest naming the field.
        try:
            stub.Infer(
                pb.InferRequest(
                    model=model, prompt="Hi", parameters=pb.GenerationParameters(top_p=1.5)
                ),
                timeout=30,
            )
        except grpc.RpcError as error:
            status_proto = rpc_status.from_call(error)
            for detail in status_proto.details if status_proto else []:
                bad_request = error_details_pb2.BadRequest()
                if detail.Unpack(bad_request):
                    for violation in bad_request.field_violations:
                        print(
                            f"ERROR code={error.code().name} field={violation.field} "
                            f"description={violation.description}"
                        )
        else:
            sys.exit("expected INVALID_ARGUMENT for top_p=1.5")

        # 5. Chat messages, rendered by the model's chat template, with each generated
        # token's log-probability and its most likely alternatives.
        chat = stub.Infer(
            pb.InferRequest(
                model=model,
                messages=[
                    pb.ChatMessage(role="system", content=CHAT_SYSTEM),
                    pb.ChatMessage(role="user", content=CHAT_USER),
                ],
                parameters=pb.GenerationParameters(
                    max_tokens=8, temperature=0, logprobs=True, top_logprobs=TOP_LOGPROBS
                ),
            ),
            timeout=30,
        )
        print("CHAT", json.dumps(chat.text))
        print(f"LOGPROBS tokens={len(chat.logprobs)} top={TOP_LOGPROBS}")
        for token in chat.logprobs:
            print(f"LOGPROB {token.token_id} {token.logprob:.4f} {json.dumps(token.token)}")
            for alternative in token.top:
                quoted = json.dumps(alternative.token)
                print(f"TOP {alternative.token_id} {alternative.logprob:.4f} {quoted}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", nargs="?", default="localhost:50051")
    parser.add_argument("model", nargs="?", default="demo")
    parser.add_argument("--lb", default="", help="load-balancing policy, e.g. round_robin")
    args = parser.parse_args()
    main(args.target, args.model, args.lb)
