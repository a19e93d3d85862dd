"""Policy backends: one interface for batched generation from token ids (see `backend.py`)."""
