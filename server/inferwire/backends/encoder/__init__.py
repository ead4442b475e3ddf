"""`onnxruntime-encoder`: embedding models on ONNX Runtime, in the server's process
(`backend`: the Backend; `model`: an encoder folder loaded; `step_loop`: its batches)."""
