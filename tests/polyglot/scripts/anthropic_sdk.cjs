// Anthropic's TypeScript SDK (@anthropic-ai/sdk, run by node) against a live inferwire:
// create, the stream helper, a tools round trip, countTokens and two errors. Prints one
// JSON object of what it saw; tests/polyglot/test_anthropic_clients.py checks it.
// Usage: node anthropic_sdk.cjs <node_modules folder> <base URL> <model>
const path = require("node:path");

const [folder, baseURL, model] = process.argv.slice(2);
const Anthropic = require(path.resolve(folder, "@anthropic-ai", "sdk")).default;

const weather = {
  type: "object",
  properties: { city: { type: "string", maxLength: 12 } },
  required: ["city"],
  additionalProperties: false,
};
const tools = [{ name: "get_weather", description: "The weather.", input_schema: weather }];
const asked = [{ role: "user", content: "What is the weather in Paris?" }];

async function main() {
  const client = new Anthropic({ baseURL, apiKey: "unused", maxRetries: 0 });
  const greeting = [{ role: "user", content: "Good morrow!" }];
  const created = await client.messages.create({
    model, max_tokens: 16, messages: greeting, temperature: 0,
  });
  const stream = client.messages.stream({
    model, max_tokens: 16, messages: greeting, temperature: 0,
  });
  let streamedText = "";
  stream.on("text", (text) => { streamedText += text; });
  const streamed = await stream.finalMessage();
  const called = await client.messages.create({
    model, max_tokens: 160, messages: asked, tools,
    tool_choice: { type: "any", disable_parallel_tool_use: true },
  });
  const use = called.content.find((block) => block.type === "tool_use");
  const answered = await client.messages.create({
    model, max_tokens: 8, tools,
    messages: [
      ...asked,
      { role: "assistant", content: called.content },
      { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: "Sunny." }] },
    ],
  });
  const counted = await client.messages.countTokens({ model, messages: greeting });
  const errors = {};
  for (const [name, params] of [
    ["unknown_model", { model: "claude-sonnet-4-5", max_tokens: 8, messages: greeting }],
    ["image", {
      model, max_tokens: 8,
      messages: [{ role: "user", content: [
        { type: "image", source: { type: "base64", media_type: "image/png", data: "AA==" } },
      ] }],
    }],
  ]) {
    try {
      await client.messages.create(params);
      errors[name] = null;
    } catch (error) {
      errors[name] = { status: error.status, type: error.error?.error?.type, name: error.constructor.name };
    }
  }
  console.log(JSON.stringify({
    created, streamed, streamedText, called, use, answered, counted, errors,
  }));
}

main().catch((error) => { console.error(error); process.exit(1); });
