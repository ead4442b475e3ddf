// Example: call inferwire from Node.js with @grpc/grpc-js and the ts-proto
// stubs in src/gen.
//
//   node dist/example.js [host:port] [model]    (default localhost:50051 demo)
//
// It runs Infer, streams InferStream deltas as they arrive, checks the
// standard grpc.health.v1 service for "model/<model>", reads the
// google.rpc.BadRequest details of an INVALID_ARGUMENT error, and sends a chat
// request with log-probabilities.
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
// The chat request every language's example sends: greedy, so that the tokens
// and their log-probabilities are the same from every client.
const CHAT_SYSTEM = "You are a player in a Shakespeare play.";
const CHAT_USER = "Good morrow! What news from Verona?";
const TOP_LOGPROBS = 3;

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

/** `text` as a JSON string literal in plain ASCII (non-ASCII as \uXXXX escapes), as every example prints it. */
function jsonQuote(text: string): string {
  return JSON.stringify(text).replace(/[^\x20-\x7e]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
}

/** One line of the log-probability listing: kind, token id, log-probability, quoted text. */
function logprobLine(kind: "LOGPROB" | "TOP", entry: { tokenId: number; logprob: number; token: string }): string {
  return `${kind} ${entry.tokenId} ${entry.logprob.toFixed(4)} ${jsonQuote(entry.token)}`;
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

    // 5. Chat messages, rendered by the model's chat template, with each
    // generated token's log-probability and its most likely alternatives.
    const chat = await infer(
      client,
      InferRequest.fromPartial({
        model,
        messages: [
          { role: "system", content: CHAT_SYSTEM },
          { role: "user", content: CHAT_USER },
        ],
        parameters: { maxTokens: 8, temperature: 0, logprobs: true, topLogprobs: TOP_LOGPROBS },
      }),
    );
    console.log(`CHAT ${jsonQuote(chat.text)}`);
    console.log(`LOGPROBS tokens=${chat.logprobs.length} top=${TOP_LOGPROBS}`);
    for (const token of chat.logprobs) {
      console.log(logprobLine("LOGPROB", token));
      for (const alternative of token.top) {
        console.log(logprobLine("TOP", alternative));
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
