// Opens many InferStream calls at once on one @grpc/grpc-js channel, as a gateway
// multiplexing its users does, and prints how they ended: one JSON object of
// status code name -> count.
//
//   node grpcjs_burst.js <clients/typescript> <host:port> <model> <streams> <max_tokens>
"use strict";
const path = require("node:path");

const [clientDir, target, model, streams, maxTokens] = process.argv.slice(2);
const grpc = require(path.join(clientDir, "node_modules", "@grpc", "grpc-js"));
const api = require(path.join(clientDir, "dist", "index.js"));

const client = new api.InferenceServiceClient(target, grpc.credentials.createInsecure());
const request = api.InferStreamRequest.fromPartial({
  model,
  prompt: "ROMEO:",
  parameters: { maxTokens: Number(maxTokens) },
});
const names = Object.fromEntries(Object.entries(grpc.status).map(([name, code]) => [code, name]));

function one() {
  return new Promise((resolve) => {
    const call = client.inferStream(request, new grpc.Metadata(), {
      deadline: Date.now() + 300_000,
    });
    call.on("data", () => {});
    call.on("error", (err) => resolve(names[err.code] || String(err.code)));
    call.on("end", () => resolve("OK"));
  });
}

Promise.all(Array.from({ length: Number(streams) }, one)).then((codes) => {
  const counts = {};
  for (const code of codes) counts[code] = (counts[code] || 0) + 1;
  console.log(JSON.stringify(counts));
  client.close();
});
