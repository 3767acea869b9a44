"""The one exception type the package raises for bad user input.

The CLI turns a :class:`CELError` into a one-line message and exit status 2.
"""


class CELError(ValueError):
    """Bad input from the user: unknown model or task, head out of range, malformed file..."""
