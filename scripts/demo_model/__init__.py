"""The stages that build the bundled `demo` model (run by scripts/train_demo_model.py).

- corpus: fetch, clean and split the Shakespeare texts
- tokenizer: the byte-level BPE tokenizer, and the texts as token ids
- training: the Llama's shape, its schedule and the training loop
- export: ONNX Runtime GenAI's model builder, and installing what it wrote
- chat: the chat template written into the exported tokenizer_config.json
- evaluation: held-out perplexity and the word test, on the torch and the ONNX model
- quality: what the word test asks, shared with tests/engine/test_demo_quality.py
- card: MODEL_CARD.md from MODEL_CARD.md.template and the run's facts

Only `quality`, `chat` and `card` import nothing beyond the standard library; the others import
torch, transformers, tokenizers or onnxruntime inside their functions.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SEED = 20261129
