"""Each model's prompt cache (a backend that keeps finished requests' KV for the next turn
of a conversation: llama-cpp, and onnxruntime-genai's continuous path), read from the
backends at every scrape."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from inferwire.core.facts import PromptCacheStats


class PromptCacheMetrics(Collector):
    """`inferwire_prompt_cache_*{model}`; hit rate = reused_tokens / prompt_tokens."""

    def __init__(self, caches: Callable[[], dict[str, PromptCacheStats]]) -> None:
        self._caches = caches

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # registering reads nothing

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        caches = self._caches()
        conversations = GaugeMetricFamily(
            "inferwire_prompt_cache_conversations",
            "Finished requests whose tokens a slot keeps for a prompt that shares their prefix.",
            labels=("model",),
        )
        cached_bytes = GaugeMetricFamily(
            "inferwire_prompt_cache_bytes",
            "KV cache those conversations hold (inside the model's footprint).",
            labels=("model",),
        )
        prompt = CounterMetricFamily(
            "inferwire_prompt_cache_prompt_tokens",
            "Prompt tokens of requests that went through the cache.",
            labels=("model",),
        )
        reused = CounterMetricFamily(
            "inferwire_prompt_cache_reused_tokens",
            "Prompt tokens read from the cache instead of computed.",
            labels=("model",),
        )
        for model, stats in sorted(caches.items()):
            conversations.add_metric([model], stats.cached_conversations)
            cached_bytes.add_metric([model], stats.cached_bytes)
            prompt.add_metric([model], stats.prompt_tokens_total)
            reused.add_metric([model], stats.reused_tokens_total)
        yield from (conversations, cached_bytes, prompt, reused)
