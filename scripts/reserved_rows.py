"""How a reserved slot's row starts on a static engine: measured for issue 36.

    INFERWIRE_RESERVED_ROWS={none,reform,generator}, set per server by this script:
    python -m scripts.reserved_rows [--repeat 2] [--slots 2 4]

The bundled model on the engine path (static batching on the CPU), tenants `chat`
(interactive) and `nightly` (batch), the default reserve of one interactive slot; the
noisy tenant keeps 16 streams of 600 tokens going, the quiet one sends 20 streams of 16
tokens one at a time, 0.2 s apart. For 2 and 4 slots and each way a reserved row may
start, it prints the quiet tenant's queue and TTFT p50/p99 and the noise's tokens/s:
- none: the engine as it was (a waiting row re-forms the batch when it would double it,
  else after static_batch_steps);
- reform: a reserved row waiting re-forms the running batch at once;
- generator: a reserved row runs on a generator of its own beside the engine.
A measuring tool for docs/ort_genai_batching.md.
"""

from __future__ import annotations

import argparse
import os
import statistics

from bench.tenant_isolation import RESERVE, Noise, measure

MODES = ("none", "reform", "generator")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--slots", type=int, nargs="*", default=[2, 4])
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    keys = ("queue_p50_ms", "queue_p99_ms", "ttft_p50_ms", "ttft_p99_ms", "noisy_tokens_per_s")
    print("| slots | reserved row | " + " | ".join(keys) + " | load average |")
    for slots in args.slots:
        noise = Noise("long", slots, 16, 600, (RESERVE,))
        for mode in MODES:
            runs = [
                measure(noise, RESERVE, 20, 16, {"INFERWIRE_RESERVED_ROWS": mode}, pause_s=0.2)[
                    "with_noise"
                ]
                for _ in range(args.repeat)
            ]
            medians = [statistics.median(r[k] for r in runs) for k in keys]
            load = os.getloadavg()[0]
            cells = " | ".join(f"{m:.1f}" for m in medians)
            print(f"| {slots} | {mode} | {cells} | {load:.2f} |", flush=True)


if __name__ == "__main__":
    main()
