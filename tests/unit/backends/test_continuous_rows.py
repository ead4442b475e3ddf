"""continuous/rows.py: which rows a decode step runs together."""

from __future__ import annotations

from inferwire.backends.ort_genai.continuous.rows import Slot, row_stretches


def test_a_step_runs_each_stretch_of_one_adapter_on_one_kernels() -> None:
    slots = [Slot(0, kernels=1), Slot(1, kernels=1), Slot(2, adapter="a"), Slot(3, kernels=1)]
    assert row_stretches(slots) == [(0, 2, "", 1), (2, 3, "a", 0), (3, 4, "", 1)]
    assert row_stretches([]) == []
