"""The one base of every error a user causes and can fix by changing an input (a config value, a data
file, a run dir, the device). Each names the key or file, the value and what was expected, and is raised
before any model is built; ``python -m recipes.run`` prints its message and exits 1, with no traceback."""
from __future__ import annotations


class InputError(ValueError):
    """Bad input: the message says what, where and what was expected."""


def tool_main(entry, argv: list[str], usage: str) -> None:
    """Run ``entry(argv)`` for a ``python -m`` tool that takes Hydra overrides (``recipes.explain``,
    ``recipes.probe``, ``core.launch``): ``-h``/``--help`` prints ``usage`` (the tool's docstring); an
    :class:`InputError`, or an override Hydra cannot parse or compose, prints its message and exits 1, with no
    traceback, as ``python -m recipes.run`` does. Every other error keeps its traceback."""
    import sys

    from hydra.errors import ConfigCompositionException, OverrideParseException

    if printed_help(argv, usage):
        return
    try:
        entry(argv)
    except InputError as e:
        sys.exit(f"{type(e).__name__}: {e}")
    except (ConfigCompositionException, OverrideParseException) as e:
        cause = f"\n{e.__cause__}" if e.__cause__ is not None else ""
        sys.exit(f"{e}{cause}")


def printed_help(argv: list[str], usage: str) -> bool:
    """``-h``/``--help`` among ``argv``: print ``usage`` (a ``python -m`` tool's docstring) and return True, so the
    tool does nothing else (never reads the flag as a name or a path)."""
    if {"-h", "--help"} & set(argv):
        print(usage.strip())
        return True
    return False
