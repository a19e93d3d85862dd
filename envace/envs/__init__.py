"""Tool environments behind one small protocol (see `base.py`)."""
