"""The model-server gauges the Kubernetes inference gateway's endpoint picker reads.

The picker (Gateway API Inference Extension; llm-d's EPP) scrapes each pod's /metrics and,
for a pod labelled `llm-d.ai/engine-type: vllm`, reads vLLM's gauges, taking ONE series
per family (the one with the latest timestamp, else the first). So `ModelServerGauges`
exports each family once, for the whole server (core/server_load.py), computed at every
scrape, so it moves with the change it reports; the per-model detail stays in the
`inferwire_*` families:
- `vllm:num_requests_waiting`, `vllm:num_requests_running`;
- `vllm:kv_cache_usage_perc` (a fraction, 0 to 1);
- `vllm:lora_requests_info` (value: the Unix time its labels last changed; labels
  `max_lora`, `running_lora_adapters`, `waiting_lora_adapters`, comma-separated names).

From the start of a drain (SIGTERM) none of them is served, the rest of the registry still
is: a picker that reads a pod's endpoints from a file, with no Kubernetes readiness to tell
it, sees the pod's metrics go stale and stops choosing it, while the pod still serves for
`server.shutdown_delay_s` (tests/gateway measures it with llm-d's picker).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from inferwire.core.server_load import ServerLoad


class ModelServerGauges(Collector):
    """vLLM's gauges, one series each, for the whole server, read at every scrape."""

    def __init__(self, load: Callable[[], ServerLoad]) -> None:
        self._load = load
        self._lora: tuple[tuple[str, str, str], float] | None = None  # labels, changed at

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # registering reads nothing; every scrape reads the load

    def collect(self) -> Iterator[GaugeMetricFamily]:
        load = self._load()
        if not load.accepting:
            return  # draining: no gauges, so the gateway stops choosing this server
        yield _gauge(
            "vllm:num_requests_waiting", "Requests waiting to start, all models.", load.waiting
        )
        yield _gauge("vllm:num_requests_running", "Requests generating, all models.", load.running)
        yield _gauge(
            "vllm:kv_cache_usage_perc",
            "Fraction (0-1) of the KV cache held by running requests (the fullest pool).",
            load.kv_cache_usage,
        )
        # When every adapter fits, one more than there are: llm-d's LoRA-affinity scorer
        # takes a pod whose adapters are all resident, with max_lora equal to their number,
        # for a full one and scores every other model's requests 0 there (tests/gateway).
        all_fit = load.max_adapters >= load.adapters_known
        labels = (
            str(load.max_adapters + 1 if all_fit else load.max_adapters),
            ",".join(load.adapters_running),
            ",".join(load.adapters_waiting),
        )
        if self._lora is None or self._lora[0] != labels:
            self._lora = (labels, time.time())
        family = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "Adapters running (resident or in flight) and waiting; value: when this last changed.",
            labels=("max_lora", "running_lora_adapters", "waiting_lora_adapters"),
        )
        family.add_metric(list(labels), self._lora[1])
        yield family


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)
