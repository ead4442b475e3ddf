"""The llama-cpp scheduler's step plan: next tokens first, prompts first come first
served within `prefill_tokens`, rows in slot order."""

from __future__ import annotations

from inferwire.backends.llama_cpp.step_plan import Runner, plan_step


def test_every_running_request_decodes_its_next_token_in_slot_order() -> None:
    runners = [Runner(5, seated=1, pending=0), Runner(2, seated=2, pending=0)]
    assert plan_step(runners, batch_tokens=64, prefill_tokens=16) == [(2, 1), (5, 1)]


def test_prompts_are_read_first_come_first_served_within_the_prefill_budget() -> None:
    runners = [
        Runner(0, seated=9, pending=100),  # seated last
        Runner(1, seated=3, pending=10),
        Runner(2, seated=4, pending=100),
        Runner(3, seated=1, pending=0),  # running
    ]
    plan = plan_step(runners, batch_tokens=2048, prefill_tokens=64)
    # 64 prompt rows: the earliest seated prompt whole (10), the next one in part (54);
    # the last seated gets none this step.
    assert plan == [(1, 10), (2, 54), (3, 1)]


def test_the_batch_bounds_prompt_rows_after_the_next_tokens() -> None:
    runners = [Runner(seq, seated=seq, pending=0) for seq in range(6)]
    runners.append(Runner(6, seated=7, pending=50))
    plan = plan_step(runners, batch_tokens=16, prefill_tokens=256)
    assert dict(plan)[6] == 10  # 16 rows, 6 of them next tokens
    assert [seq for seq, _ in plan] == list(range(7))


def test_a_full_batch_of_next_tokens_leaves_prompts_waiting() -> None:
    runners = [Runner(0, seated=1, pending=0), Runner(1, seated=2, pending=5)]
    assert plan_step(runners, batch_tokens=1, prefill_tokens=256) == [(0, 1)]
