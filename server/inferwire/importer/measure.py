"""The built model, loaded once in a process of its own: it must load and make a token, and
the memory its load takes (resident set growth) is recorded for the server's estimate.

Run as `python -m inferwire.importer.measure DIR`; prints one JSON object.
"""

from __future__ import annotations

import json
import sys


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def main() -> None:
    import onnxruntime_genai as og

    before = _rss_bytes()
    model = og.Model(sys.argv[1])
    og.Tokenizer(model)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=2, batch_size=1)
    generator = og.Generator(model, params)
    generator.append_tokens([0])
    generator.generate_next_token()  # as the server's load warms the model up
    print(json.dumps({"load_rss_bytes": _rss_bytes() - before}))


if __name__ == "__main__":
    main()
