// Calls every RPC that takes a model name with a 100 KB name through @grpc/grpc-js,
// on one channel, and after each one a ListModels on the same channel. Prints one
// JSON line per RPC: {rpc, code, fields, message_bytes, next_call_ok}.
//
//   node grpcjs_huge_model_name.js <clients/typescript> <host:port>
"use strict";
const path = require("node:path");

const [clientDir, target] = process.argv.slice(2);
const grpc = require(path.join(clientDir, "node_modules", "@grpc", "grpc-js"));
const api = require(path.join(clientDir, "dist", "index.js"));

const HUGE = "m".repeat(100_000);
const DEADLINE_MS = 10_000;
const BAD_REQUEST_TYPE_URL = "type.googleapis.com/google.rpc.BadRequest";

const client = new api.InferenceServiceClient(target, grpc.credentials.createInsecure());
const health = new api.HealthClient(target, grpc.credentials.createInsecure(), {
  channelOverride: client.getChannel(),
});

function options() {
  return { deadline: Date.now() + DEADLINE_MS };
}

function unary(method, request) {
  return new Promise((resolve) => {
    method(request, new grpc.Metadata(), options(), (err, response) => resolve({ err, response }));
  });
}

function stream(request) {
  return new Promise((resolve) => {
    const call = client.inferStream(request, new grpc.Metadata(), options());
    call.on("data", () => {});
    call.on("error", (err) => resolve({ err }));
    call.on("end", () => resolve({ err: null }));
  });
}

function fieldsOf(err) {
  const [details] = err.metadata.get("grpc-status-details-bin");
  if (!(details instanceof Buffer)) return [];
  const status = api.Status.decode(details);
  const any = status.details.find((d) => d.typeUrl === BAD_REQUEST_TYPE_URL);
  return any ? api.BadRequest.decode(any.value).fieldViolations.map((v) => v.field) : [];
}

const calls = {
  LoadModel: () => unary(client.loadModel.bind(client), { model: HUGE }),
  UnloadModel: () => unary(client.unloadModel.bind(client), { model: HUGE }),
  Infer: () => unary(client.infer.bind(client), { model: HUGE, prompt: "hi", context: [], messages: [], priority: 0, tools: [] }),
  InferStream: () => stream({ model: HUGE, prompt: "hi", context: [], messages: [], priority: 0, tools: [] }),
  Tokenize: () => unary(client.tokenize.bind(client), { model: HUGE, prompt: "hi", messages: [] }),
  Health: () => unary(client.health.bind(client), { model: HUGE }),
  "grpc.health.v1.Health/Check": () => unary(health.check.bind(health), { service: "model/" + HUGE }),
};

async function main() {
  for (const [rpc, run] of Object.entries(calls)) {
    const { err } = await run();
    const next = await unary(client.listModels.bind(client), {});
    console.log(
      JSON.stringify({
        rpc,
        code: err ? grpc.status[err.code] : "OK",
        fields: err ? fieldsOf(err) : [],
        message_bytes: err ? Buffer.byteLength(err.details) : 0,
        next_call_ok: next.err === null && next.response.models.length > 0,
      }),
    );
  }
  client.close();
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
