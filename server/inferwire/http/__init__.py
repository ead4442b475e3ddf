"""The second door: the OpenAI-compatible HTTP API, on the same core as gRPC.

`inferwire.api` serves the protobuf contract over gRPC; this package serves the same
models, tokens, tenants, quotas, priorities, adapters and memory budget as OpenAI's
Completions and Chat Completions (and vLLM's /tokenize and /detokenize) over HTTP, for
the OpenAI SDKs, LangChain and the LLM load tools. Both call the core (`inferwire.core`)
and the edge (`inferwire.edge`: who is calling, the error table, the access line); this
package imports neither `inferwire.api` nor grpc. `inferwire/server.py` assembles both
doors on one event loop (docs/http.md).

- `requests.py`: an OpenAI request body as the core's InferenceRequest, and what is refused;
- `completion_output.py`: Completions' and Chat Completions' results and chunks as JSON;
- `responses_api/`: OpenAI's Responses API (its routes, input, output and store);
- `bodies.py`: reading a body (size, type, JSON, slow senders);
- `errors.py`: an error as OpenAI's error body with the HTTP status of its code;
- `calls.py`: every request's principal, access line and span;
- `routes.py`: the routes; `listener.py`: uvicorn on the server's loop, TLS, shutdown.
"""
