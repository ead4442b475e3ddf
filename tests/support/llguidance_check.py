"""Run in llguidance's own virtualenv (tests/support/side_venvs.py): reads
`{"tokenizer": <tokenizer.json path>, "cases": [{"grammar": <lark>, "text": ...}]}` from
standard input and prints, for each case, whether the grammar accepts the text's tokens
as a whole answer ("accepted"), or where it stops ("rejected: ...")."""

import json
import sys

import llguidance

job = json.load(sys.stdin)
with open(job["tokenizer"]) as file:
    tokenizer = llguidance.LLTokenizer(file.read())
out = []
for case in job["cases"]:
    grammar = llguidance.grammar_from("lark", case["grammar"])
    error, warnings = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
    if error:
        out.append(f"invalid grammar: {warnings}")
        continue
    matcher = llguidance.LLMatcher(tokenizer, grammar)
    tokens = tokenizer.tokenize_str(case["text"])
    taken = matcher.validate_tokens(tokens)
    if taken < len(tokens):
        out.append(f"rejected: at token {taken} of {len(tokens)}")
    elif not (matcher.consume_tokens(tokens) and matcher.is_accepting()):
        out.append(f"rejected: incomplete ({matcher.get_error()})")
    else:
        out.append("accepted")
print(json.dumps(out))
