"""The one base of every error a user causes and can fix by changing an input (a config value, a data
file, a run dir, the device). Each names the key or file, the value and what was expected, and is raised
before any model is built; ``python -m recipes.run`` prints its message and exits 1, with no traceback."""
from __future__ import annotations


class InputError(ValueError):
    """Bad input: the message says what, where and what was expected."""
