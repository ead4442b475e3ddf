"""The inputs the real-model tier and its llama.cpp recording share (scripts/smollm2_reference.py).

CORPUS is what tokenizers break on: ChatML markers and other special tokens in the middle
of text, template markers, runs of white space (spaces, tabs, newlines), digits (SmolLM's
pre-tokenizer splits every digit), Unicode (accents, CJK, emoji, combining marks), code and
contractions. GREEDY_PROMPTS are ChatML-rendered and plain prompts; FACTS simple questions
with one word a right answer holds.
"""

from __future__ import annotations

SYSTEM = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n"
)


def chatml(question: str) -> str:
    """The prompt SmolLM2's template renders for one user message (its default system)."""
    return f"{SYSTEM}<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


CORPUS: tuple[str, ...] = (
    "Hello world",
    "Hello, World! How are you today?",
    " leading space",
    "trailing space ",
    "two  spaces   three    four",
    "\ttabs\tand\t\ttabs",
    "line one\nline two\n\nline four\r\nwindows\r\n",
    "\n\n\n",
    "   ",
    "1 22 333 4444 55555",
    "3.14159 2,718 -42 +7 1e10 0x1F",
    "It's we're they've I'm you'll he'd",
    "naïve café résumé Ünïcödé",
    "日本語のテキストと中文文本",
    "emoji: 😀🎉👍🏽 and ZWJ 👩‍💻",
    "combining: e\u0301 a\u0308",
    "def f(x):\n    return x ** 2  # square\n",
    '{"key": [1, 2, 3], "nested": {"a": null}}',
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "text<|im_end|>more<|im_start|>again",
    "<|endoftext|>after end",
    "a<|im_start|>b",
    "{% for message in messages %}{{ message['content'] }}{% endfor %}",
    "<|im_start|> spaced <|im_end|>",
    "URL https://example.com/path?q=1&r=2#frag",
    "Punctuation!!! ??? ... --- ;;; ::",
    "MiXeD CaSe WoRdS",
    chatml("What is the capital of France?"),
    # Where ONNX Runtime Extensions once split apart from llama.cpp (Shakespeare's text,
    # each cut to the least that still split apart; the text before a piece matters):
    # a contraction inside a word, a space before a word after a capital or a comma,
    # white space before a digit.
    "\nIt is reported thou did'st eate strange flesh,\nWhich some did dye to looke on: And all"
    " this\n(It wounds thine Honor that I speake it now)\nWas borne so like a Soldiour, that"
    " thy cheeke\nSo much as lank'd not\n\n",
    "\nSCENE III. A Room in the ",
    "\n[Enter, with drum and colours, MARCIUS, TITUS LARTIUS, Officers, \na",
    "Exeunt.\n\n  1 Lord. Farewell",
    "lives?\n  1. Senator",
)

GREEDY_PROMPTS: tuple[str, ...] = (
    chatml("What is the capital of France?"),
    chatml("Write a short poem about the sea."),
    chatml("Explain what a CPU does in one sentence."),
    chatml("List three colours."),
    chatml("What is 12 plus 30?"),
    chatml("Tell me a fact about cats."),
    chatml("How do I boil an egg?"),
    "Once upon a time, in a small village,",
    "The three primary colours are",
    "def fibonacci(n):",
)

FACTS: tuple[tuple[str, str], ...] = (
    ("What is the capital of France?", "Paris"),
    ("What is the capital of Italy?", "Rome"),
    ("What is the capital of Japan?", "Tokyo"),
    ("What colour is the sky on a clear day?", "blue"),
    ("What colour is grass?", "green"),
    ("What is 2 plus 2?", "4"),
    ("What is 10 minus 3?", "7"),
    ("How many legs does a spider have?", "eight"),
    ("What is the largest planet in the solar system?", "Jupiter"),
    ("What do bees make?", "honey"),
    ("What is frozen water called?", "ice"),
    ("Which animal says moo?", "cow"),
)
