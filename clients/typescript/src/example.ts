// Example: call inferwire from Node.js with @grpc/grpc-js and the ts-proto
// stubs in src/gen.
//
//   node dist/example.js [host:port] [model]    (default localhost:50051 demo)
//
// It runs Infer, streams InferStream deltas as they arrive, checks the
// standard grpc.health.v1 service for "model/<model>", and reads the
// google.rpc.BadRequest details of an INVALID_ARGUMENT error.
import { credentials, Metadata, status, type ServiceError } from "@grpc/grpc-js";
import { BadRequest } from "./gen/google/rpc/error_details";
import { Status } from "./gen/google/rpc/status";
import { HealthClient, healthCheckResponse_ServingStatusToJSON, type HealthCheckResponse } from "./gen/health/v1/health";
import {
  finishReasonToJSON,
  InferenceServiceClient,
  InferRequest,
  type InferResponse,
  InferStreamRequest,
  type InferStreamResponse,
} from "./gen/inferwire/v1/inference";

const BAD_REQUEST_TYPE_URL = "type.googleapis.com/google.rpc.BadRequest";
const DEADLINE_MS = 60_000;

function callOptions() {
  return { deadline: Date.now() + DEADLINE_MS };
}

function infer(client: InferenceServiceClient, request: InferRequest): Promise<InferResponse> {
  return new Promise((resolve, reject) => {
    client.infer(request, new Metadata(), callOptions(), (err, response) => (err ? reject(err) : resolve(response)));
  });
}

function healthCheck(client: HealthClient, service: string): Promise<HealthCheckResponse> {
  return new Promise((resolve, reject) => {
    client.check({ service }, new Metadata(), callOptions(), (err, response) => (err ? reject(err) : resolve(response)));
  });
}

function isServiceError(err: unknown): err is ServiceError {
  return err instanceof Error && "code" in err && "metadata" in err;
}

/** The google.rpc.BadRequest carried in the error's grpc-status-details-bin trailer, if any. */
function badRequestOf(err: ServiceError): BadRequest | undefined {
  const [details] = err.metadata.get("grpc-status-details-bin");
  if (!(details instanceof Buffer)) {
    return undefined;
  }
  const rpcStatus = Status.decode(details);
  const any = rpcStatus.details.find((detail) => detail.typeUrl === BAD_REQUEST_TYPE_URL);
  return any === undefined ? undefined : BadRequest.decode(any.value);
}

async function main(target: string, model: string): Promise<void> {
  const client = new InferenceServiceClient(target, credentials.createInsecure());
  const health = new HealthClient(target, credentials.createInsecure());
  try {
    // 1. Unary Infer.
    const response = await infer(
      client,
      InferRequest.fromPartial({ model, prompt: "Write one sentence about gRPC.", parameters: { maxTokens: 16 } }),
    );
    console.log(`INFER ${JSON.stringify(response.text)}`);

    // 2. Server-streaming InferStream: print each delta as it arrives. The
    // call is a Node Readable; grpc-js types its async iterator as `any`.
    const stream = client.inferStream(
      InferStreamRequest.fromPartial({ model, prompt: "Count from one to ten.", parameters: { maxTokens: 24 } }),
      new Metadata(),
      callOptions(),
    );
    let deltas = 0;
    let last: InferStreamResponse | undefined;
    for await (const message of stream as AsyncIterable<InferStreamResponse>) {
      if (message.text !== "") {
        deltas += 1;
        console.log(`DELTA ${JSON.stringify(message.text)}`);
      }
      last = message;
    }
    if (last === undefined) {
      throw new Error("InferStream returned no messages");
    }
    console.log(`STREAM_END finish_reason=${finishReasonToJSON(last.finishReason)} deltas=${deltas}`);

    // 3. Standard grpc.health.v1 Check for the model.
    const service = `model/${model}`;
    const healthResponse = await healthCheck(health, service);
    console.log(`HEALTH ${service} ${healthCheckResponse_ServingStatusToJSON(healthResponse.status)}`);

    // 4. An invalid request: INVALID_ARGUMENT with google.rpc.BadRequest details.
    try {
      await infer(client, InferRequest.fromPartial({ model, prompt: "Hello", parameters: { topP: 1.5 } }));
      throw new Error("the invalid request (top_p = 1.5) succeeded");
    } catch (err) {
      if (!isServiceError(err) || err.code !== status.INVALID_ARGUMENT) {
        throw err;
      }
      const badRequest = badRequestOf(err);
      if (badRequest === undefined || badRequest.fieldViolations.length === 0) {
        throw new Error(`INVALID_ARGUMENT without BadRequest details: ${err.details}`);
      }
      for (const violation of badRequest.fieldViolations) {
        console.log(
          `ERROR code=${status[err.code]} field=${violation.field} description=${violation.description}`,
        );
      }
    }
  } finally {
    client.close();
    health.close();
  }
}

const [target = "localhost:50051", model = "demo"] = process.argv.slice(2);
main(target, model).catch((err: unknown) => {
  console.error(isServiceError(err) ? `example failed: ${status[err.code]}: ${err.details}` : err);
  process.exitCode = 1;
});
