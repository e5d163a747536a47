"""Run untrusted code out of reach of an orrery-env/1 environment's secrets (standard library only).

An environment program runs with its directory at /env and its hidden tests in its memory: code it
executed itself (the model's solution, a tool that runs the model's code) could read both. Instead
it asks Orrery, with the protocol's `run_isolated` request (docs/env-protocol.md), to run the code
in a sandbox of its own that holds nothing but the files given here, once per input, and compares
the outputs with what it expects here, in its own memory. Copy this file next to your program (it
is in the directory mounted at /env) and import it:

    import orrery_isolated
    runs = orrery_isolated.run_isolated({"solution.py": code},
                                        ["/usr/bin/python3", "-I", "solution.py"],
                                        [test_input for test_input, _ in tests])
    passed = sum(orrery_isolated.passed(r, expected) for r, (_, expected) in zip(runs, tests))

Call it only while answering one of Orrery's requests (reset, step, score): Orrery reads requests
from the program only while it waits for a reply, and the runs count against that request's
deadline (`wall_seconds`).
"""
import itertools
import json
import sys

_ids = itertools.count(1)


class IsolatedRunError(Exception):
    """Orrery refused the request (bad params) or could not run it (the message says which)."""


def run_isolated(files, argv, inputs, seconds_each=5.0):
    """Runs argv once per input (on stdin) in a fresh sandbox holding only `files` in /work.

    files: {relative path: contents}; argv: the command; inputs: a list of strings (at most 256).
    Returns one dict per input, in order: exit_code (-1 when killed), signal, timed_out,
    limit_exceeded, output_truncated, stdout, stderr, wall_seconds, status ("exit 0", ...).
    """
    rid = f"orrery-isolated-{next(_ids)}"
    request = {"jsonrpc": "2.0", "id": rid, "method": "run_isolated",
               "params": {"files": files, "argv": argv, "inputs": list(inputs),
                          "seconds_each": seconds_each}}
    sys.stdout.write(json.dumps(request) + "\n")
    sys.stdout.flush()
    while True:
        line = sys.stdin.readline()
        if not line:
            raise IsolatedRunError("Orrery closed stdin before answering run_isolated")
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(reply, dict) or reply.get("id") != rid:
            continue
        if "error" in reply:
            raise IsolatedRunError(reply["error"].get("message", "run_isolated failed"))
        return reply["result"]["runs"]


def passed(run, expected):
    """Exit status 0 and stdout equal to `expected`, trailing whitespace of both ignored."""
    return run["exit_code"] == 0 and run["stdout"].rstrip() == expected.rstrip()
