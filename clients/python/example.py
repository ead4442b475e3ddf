"""inferwire from Python: Infer, InferStream, a health check, and reading a
BadRequest. Uses only the generated stubs in `inferwire.v1` plus grpcio's own
packages (grpc_health, grpc_status and googleapis' google.rpc types).

    python clients/python/example.py [--lb round_robin] [HOST:PORT] [MODEL]

--lb picks a load-balancing policy: with a `dns:///host:port` target, round_robin
spreads calls over every address of the name (one per replica behind a headless
Service).
"""

from __future__ import annotations

import argparse
import json
import sys

import grpc
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc


def main(target: str = "localhost:50051", model: str = "demo", lb: str = "") -> None:
    options = []
    if lb:
        config = {"loadBalancingConfig": [{lb: {}}]}
        options.append(("grpc.service_config", json.dumps(config)))
    with grpc.insecure_channel(target, options=options) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)

        # 1. Unary Infer.
        response = stub.Infer(
            pb.InferRequest(
                model=model, prompt="ROMEO:", parameters=pb.GenerationParameters(max_tokens=16)
            ),
            timeout=30,
        )
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


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", nargs="?", default="localhost:50051")
    parser.add_argument("model", nargs="?", default="demo")
    parser.add_argument("--lb", default="", help="load-balancing policy, e.g. round_robin")
    args = parser.parse_args()
    main(args.target, args.model, args.lb)
