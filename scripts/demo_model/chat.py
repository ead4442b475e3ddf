"""The demo model's chat template, in the play-script layout the model was trained on.

The training text is speeches under speaker headings (`ROMEO:` on its own line, the
speech below it, a blank line between speeches) and stage directions in brackets. A
chat renders the same way: the user speaks as ROMEO, the model answers as JULIET, and a
system message becomes a stage direction. The generation prompt opens JULIET's speech,
so the model writes her reply; it then tends to go on with the next speaker's heading
after a blank line, which a stop string of a blank line ends.

No retraining: the template only lays out text the model already knows. Run this file
with a model directory to write the template into its tokenizer_config.json; the
training script does this for every export.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

USER_SPEAKER = "ROMEO"
ASSISTANT_SPEAKER = "JULIET"

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}"
    "{{ '[' + message['content'] | trim + ']\\n\\n' }}"
    "{%- elif message['role'] == 'user' %}"
    f"{{{{ '{USER_SPEAKER}:\\n' + message['content'] | trim + '\\n\\n' }}}}"
    "{%- elif message['role'] == 'assistant' %}"
    f"{{{{ '{ASSISTANT_SPEAKER}:\\n' + message['content'] | trim + '\\n\\n' }}}}"
    "{%- endif %}"
    "{%- endfor %}"
    f"{{%- if add_generation_prompt %}}{{{{ '{ASSISTANT_SPEAKER}:\\n' }}}}{{%- endif %}}"
)


def add_chat_template(model_dir: Path) -> None:
    """Write CHAT_TEMPLATE into `model_dir/tokenizer_config.json`, keeping its other keys."""
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config, indent=2) + "\n")


if __name__ == "__main__":
    add_chat_template(Path(sys.argv[1]))
