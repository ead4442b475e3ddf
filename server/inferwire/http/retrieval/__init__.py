"""Embeddings and rerank on the HTTP door: OpenAI's, Jina's and Cohere's shapes
(`routes`: the handlers and answers; `input`: the bodies as the core's requests)."""
