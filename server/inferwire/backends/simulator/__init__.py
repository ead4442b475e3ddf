"""The simulator backend (`backend: simulator`): no engine, a deterministic word stream
with a configured time to first token and inter-token time.

Modules: `backend` (options, lifecycle, health, the generation loop) and `schedule`
(the words, the seeds and the absolute per-token schedule: pure functions).
"""

from inferwire.backends.simulator.backend import SimulatorBackend, SimulatorOptions

__all__ = ["SimulatorBackend", "SimulatorOptions"]
