"""Rehearsing: the rehearser role (`rehearser.py`), its grounding examples (`examples.py`), private rehearsal
before a committed turn (`private.py`, `memory.py`) and its sweeps (`sweep.py`). The engine that plays episodes
is `envace.engine`."""
