"""OpenAI's Responses API on the HTTP door (`POST /v1/responses`, `GET` and `DELETE
/v1/responses/{response_id}`), over the same core call as Chat Completions.

- `routes.py`: the three routes' handlers, and the stored responses found by tenant;
- `input.py`, `items.py`: a Responses body and its input items as the core's request;
- `output.py`: the `response` object and its Server-Sent Events;
- `store.py`: the stored responses, a bounded store per model, each its tenant's.
"""
