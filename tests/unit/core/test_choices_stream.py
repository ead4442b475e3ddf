"""`n` choices streamed through the core (core/request_path.py over core/choices.py): the
usage comes once, on the chunk that ends the last choice to come out, however the choices'
generators race ahead of the reader."""

from __future__ import annotations

from inferwire.core.manager import ModelManager, ModelSpec
from inferwire.core.requests import InferenceRequest
from inferwire.core.sampling import BASE_PARAMETERS, GenerationParams
from inferwire.core.validation import RequestLimits
from tests.support.fake_backend import FAKE_BACKEND, FakeBackends


class _Metrics:
    def model_added(self, model: str) -> None: ...
    def load_changed(self, model: str, queued: int, running: int) -> None: ...
    def readiness_changed(self, model: str, ready: bool) -> None: ...
    def request_finished(self, record: object) -> None: ...


async def test_the_usage_comes_once_on_the_last_choice_s_end():
    # The reader must count the ends it has taken, not those the generators reported.
    backends = FakeBackends()
    manager = ModelManager(
        [ModelSpec(name="g", backend=FAKE_BACKEND, load_on_startup=True)],
        backends,
        RequestLimits(max_prompt_bytes=64),
        metrics=_Metrics(),  # type: ignore[arg-type]
    )
    backends["g"].parameters = BASE_PARAMETERS | {"n"}  # read when it loads
    # Each choice's tokens wait the same time, so their last ones are due in one turn of
    # the event loop: every generator reports its end before the reader takes the first.
    backends["g"].step_s = 0.01
    assert await manager.start() == {}
    try:
        request = InferenceRequest("r", "g", "hi", params=GenerationParams(n=3, seed=1))
        _, chunks = manager.infer_stream(request)
        received = [chunk async for chunk in chunks]
    finally:
        await manager.close()
    ends = [c.choice for c in received if c.finish_reason is not None]
    assert sorted(ends) == [0, 1, 2]
    with_usage = [i for i, c in enumerate(received) if c.usage is not None]
    assert with_usage == [len(received) - 1]
    assert received[-1].usage is not None and received[-1].usage.completion_tokens == 3 * 3
