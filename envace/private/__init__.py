"""Private rehearsal: the before-turn hook that imagines a turn in the rehearsed world (`rehearsal.py`), the memory
its attempts become (`memory.py`) or the attempt chosen to commit instead (`selection.py`), budget sweeps of it
(`sweep.py`) and the ladder of memories that tells why it helps or hurts (`ladder.py`). It drives the engine
(`envace.engine`), which never imports it back; `envace.build` hands the hook to the engine."""
