"""Anthropic's Messages API on the HTTP door (`POST /v1/messages`, `POST
/v1/messages/count_tokens`), over the same core call as Chat Completions.

- `routes.py`: the two routes' handlers;
- `input.py`, `blocks.py`: a Messages body and its content blocks as the core's request;
- `output.py`: the `message` object and its Server-Sent Events;
- `errors.py`: an error as Anthropic's error body, from the edge's one table.
"""
