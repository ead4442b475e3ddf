"""The stages that build the bundled `demo` model (run by scripts/train_demo_model.py)."""
