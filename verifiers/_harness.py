"""Pass-signal harness: copied into each code sandbox as ``main.py`` and run as ``python -I main.py MODE``.

Never imported by the package; standard library only (it runs under the sandbox's ``/usr/bin/python3``, with
the repository hidden). ``MODE`` is ``tests`` (``program.py``, then ``tests.py``, in one ``__main__`` namespace:
MBPP asserts, HumanEval ``check(candidate)``) or ``program`` (``program.py`` alone: stdin/stdout cases).

Why a token: with the exit status as the only pass signal, ``os._exit(0)`` (or ``sys.exit(0)``) before the asserts
scored 1.0 (issue 17). The HumanEval reference harness (openai/human-eval ``execution.py``, ``unsafe_execute``)
records "passed" only on the line after ``exec`` of program + tests returns. Across a process boundary the
equivalent is a value the program cannot produce itself: the parent (``verifiers.sandbox.run_python``) draws
``secrets.token_hex(16)`` per run and counts the run as passed only if the process exits 0 *and* the last line of
its stdout is that token, which this harness prints only after the last test statement has run without raising.

Design, and why not the alternatives:

* The token reaches the process through an anonymous pipe inherited as fd ``$RLR_TOKEN_FD``, fully written and
  closed by the parent before the start. This harness reads it and closes the fd before any program code exists
  in the process, so the token is not in argv, the environment (``/proc/self/environ`` has only the fd number),
  stdin, any file (this source has no token), or any fd the program can read; it lives only in a local of
  ``_main``.
* Everything used after the program has run is bound to locals first (``os.write``, ``os._exit``, ``compile``,
  ``exec``, ``sys.__excepthook__``): rebinding ``builtins.print``/``exec``, ``sys.stdout``, ``os.write`` or
  ``os._exit`` cannot skip the tests or fake the print. The token is written with ``os.write(1, ...)`` and the
  process ends with ``os._exit(0)`` right after, so no program code runs after it (``atexit`` handlers and
  non-daemon threads are run *before* it, as an interpreter's normal shutdown would, so legitimate output from
  them still precedes the token). Any exception, including ``SystemExit`` in ``tests`` mode, ends the process
  with status 1 and no token; an ``os._exit`` anywhere in the program ends it with no token.
* A later delivery (the parent sends the token once the harness reports "tests done", or the harness derives it
  after the last test) is no stronger: the program runs in the same interpreter, before the tests, and can take
  any step this harness can take (send "done", read the reply). So the guarantee stops where the interpreter
  stops protecting its own memory:

Not covered (documented in docs/verifiers.md): a program that deliberately inspects the interpreter can read the
local (frames via ``sys._getframe``/tracebacks/generators, ``gc``, ``ctypes``, ``/proc/self/mem``) and print it;
blocking those with an audit hook would also break ordinary code (``collections.namedtuple``, ``typing``,
``logging`` and ``traceback`` read frames). And the token certifies that the tests ran to the end without raising,
not that they test what they mean to: a program that returns objects whose ``__eq__`` is always True, or that
rebinds names the tests use (``set``, ``abs``) in the shared namespace, still passes, exactly as under the
reference harnesses. In the weaker sandbox levels (``unshare``, ``guard``) the program runs as the caller's user
and could also read the parent's memory.
"""
import builtins
import os
import sys


def _main(mode):
    write, hard_exit, excepthook, compile_, exec_, open_ = os.write, os._exit, sys.__excepthook__, compile, exec, open
    type_, exit_codes = type, (int, bool)
    fd = int(os.environ.pop("RLR_TOKEN_FD"))
    token = os.read(fd, 64)  # the parent wrote all 32 bytes and closed its end before this process started
    os.close(fd)
    if len(token) != 32:
        hard_exit(2)
    path = os.path.abspath("program.py")
    try:
        with open_(path, "rb") as f:
            program = compile_(f.read(), path, "exec", dont_inherit=True)
        tests = None
        if mode == "tests":
            with open_("tests.py", "rb") as f:
                tests = compile_(f.read(), os.path.abspath("tests.py"), "exec", dont_inherit=True)
    except BaseException:  # noqa: BLE001 - a syntax error (or anything else) fails the run
        excepthook(*sys.exc_info())
        hard_exit(1)
    # A fresh __main__ for the program, as `python program.py` would give it (pickling of its classes works).
    main = type(sys)("__main__")
    main.__file__, main.__builtins__ = path, builtins
    sys.modules["__main__"] = main
    sys.argv[:] = [path]
    try:
        exec_(program, main.__dict__)
        if tests is not None:
            exec_(tests, main.__dict__)
    except SystemExit as e:  # sys.exit(0) ends a stdin/stdout program normally; it skips the rest of the tests
        code = e.code
        if mode == "tests" or not (code is None or (type_(code) in exit_codes and code == 0)):
            hard_exit(1)
    except BaseException:  # noqa: BLE001
        try:
            excepthook(*sys.exc_info())
        finally:
            hard_exit(1)
    if not _shutdown():
        hard_exit(120)  # what the interpreter returns when flushing stdout fails at exit
    view = memoryview(b"\n" + token + b"\n")
    try:
        while view:
            view = view[write(1, view):]
    finally:
        hard_exit(0 if not view else 1)


def _shutdown():
    """The interpreter's exit sequence for the program (join non-daemon threads, atexit handlers, flush stdio),
    run before the token so their output precedes it. False if flushing the program's stdout/stderr fails."""
    try:
        if "threading" in sys.modules:
            sys.modules["threading"]._shutdown()  # what Py_Finalize calls first: join non-daemon threads
    except BaseException:  # noqa: BLE001 - ignored at a normal exit too; the status stays 0
        pass
    try:
        import atexit
        atexit._run_exitfuncs()  # prints and ignores a handler's exception, as at a normal exit
    except BaseException:  # noqa: BLE001
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and not getattr(stream, "closed", False):
                stream.flush()
        except BaseException:  # noqa: BLE001
            return False
    for stream in (sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - the interpreter ignores these at teardown
            pass
    return True


if __name__ == "__main__":  # run as the sandbox's main.py only; importing this file does nothing
    _main(sys.argv[1])
