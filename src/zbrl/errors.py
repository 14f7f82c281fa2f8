"""Errors a user sees at the command line (printed without a traceback, non-zero exit)."""


class RunError(RuntimeError):
    """A run could not complete; the message says which part failed and why."""
