"""The one exception type that means "bad input": the CLI prints its message and exits 2."""


class UsageError(Exception):
    """Bad user input (unknown name, missing path, malformed config). Message is one clear line."""
