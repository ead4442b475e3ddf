"""Importing a model for the embedded engine (`inferwire models import`): a GGUF file or a
Hugging Face checkpoint as an ONNX Runtime GenAI directory. Only the CLI imports this
package, and it needs the `inferwire[import]` extra (torch, transformers, onnx, gguf);
the server never imports it."""
