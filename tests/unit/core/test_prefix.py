import random

import pytest

from inferwire.core.prefix import shared_prefix


@pytest.mark.parametrize(
    ("cached", "prompt", "shared"),
    [
        ([], [1, 2], 0),
        ([1, 2], [], 0),
        ([1, 2, 3], [1, 2, 3], 3),
        ([1, 2, 3], [1, 2, 3, 4], 3),
        ([1, 2, 3, 4], [1, 2], 2),
        ([1, 2, 3], [1, 9, 3], 1),
        ([5, 2, 3], [1, 2, 3], 0),
    ],
)
def test_shared_prefix(cached: list[int], prompt: list[int], shared: int) -> None:
    assert shared_prefix(cached, prompt) == shared


def test_shared_prefix_matches_a_token_by_token_count() -> None:
    pick = random.Random(0)
    for _ in range(500):
        cached = [pick.randrange(3) for _ in range(pick.randrange(12))]
        prompt = cached[: pick.randrange(len(cached) + 1)] + [
            pick.randrange(3) for _ in range(pick.randrange(6))
        ]
        count = 0
        while count < min(len(cached), len(prompt)) and cached[count] == prompt[count]:
            count += 1
        assert shared_prefix(cached, prompt) == count
