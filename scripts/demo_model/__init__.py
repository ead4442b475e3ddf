"""The stages that build the bundled `demo` model (run by scripts/train_demo_model.py).

- export: ONNX Runtime GenAI's model builder, and installing what it wrote
- quality: what the word test asks, shared with tests/engine/test_demo_quality.py
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
