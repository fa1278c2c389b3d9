"""Runs the tests' Python scripts in one interpreter per test process
(tests/support/python_script.h): each run would otherwise start Python and import torch and
transformers again (2-4 s on the 2-core development VM; some tests run a script 16 times).

Protocol, on the pipes the test process holds: one request per line on stdin, a JSON object
    {"argv": [SCRIPT, ARG...], "output": PATH, "errors": PATH2}
runs SCRIPT as __main__ (runpy) with sys.argv = argv, its stdout (file descriptor 1, so output
from C extensions too) into PATH and its stderr into PATH2 (both truncated; "errors" left out:
stderr into PATH too); then writes one answer line on the original stdout:
    exit CODE
Between runs the server's own stderr (e.g. a traceback of its own) goes to that stdout too:
the reader passes on every line that is not an answer.
CODE is what `python SCRIPT ARG...` would exit with: 0, SystemExit's code (1 for a message), 1
for an uncaught exception (its traceback goes to PATH). Ends at end of input.

Each script seeds what it draws (torch.manual_seed / a Generator of its own) and sets no
process-wide torch option, so a run does not depend on the runs before it in this interpreter.
"""

import json
import os
import runpy
import sys
import traceback


def redirect(path, fd):
    opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(opened, fd)
    os.close(opened)


def run(argv, output, errors):
    """Runs one script; returns its exit code."""
    sys.stdout.flush()
    sys.stderr.flush()
    redirect(output, 1)
    if errors is None:
        os.dup2(1, 2)
    else:
        redirect(errors, 2)
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))  # as `python SCRIPT` has it
    code = 0
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as stop:
        if stop.code is None:
            code = 0
        elif isinstance(stop.code, int):
            code = stop.code
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - as the interpreter would: traceback, exit 1
        traceback.print_exc()
        code = 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def main():
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    quiet = os.open(os.devnull, os.O_WRONLY)
    errors = os.dup(2)
    os.dup2(quiet, 1)  # between runs a stray print does not reach the answer pipe
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        code = run(request["argv"], request["output"], request.get("errors"))
        os.dup2(quiet, 1)
        os.dup2(errors, 2)
        answers.write(f"exit {code}\n")


if __name__ == "__main__":
    main()
