#!/usr/bin/env python3
"""An example orrery-env/1 coding environment whose grading the model cannot read.

The model writes a Python program that reads numbers on stdin; its final assistant message carries
the program in a ```python block. The hidden tests live in /env/grade_env_tests.json, next to this
program, where any code this program ran itself could open them. So it never runs the model's code
itself: the run_python tool and the grading go through Orrery's run_isolated request
(orrery_isolated.py), which runs the code in a sandbox without /env, and the outputs are compared
here. The reward is the fraction of hidden tests passed.
"""
import json
import os
import re
import sys

import orrery_isolated

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "grade_env_tests.json")) as f:
    PROBLEMS = json.load(f)
# Disjoint splits: train asks for the even-numbered problems, test for the odd-numbered ones.
NAMES = sorted(PROBLEMS)
PYTHON = ["/usr/bin/python3", "-I", "solution.py"]

TOOLS = [{
    "type": "function",
    "function": {
        "name": "run_python",
        "description": "Run a Python 3 program with the given stdin in a sandbox; returns its "
                       "stdout, stderr and exit status.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "maxLength": 100000},
                           "stdin": {"type": "string", "maxLength": 10000}},
            "required": ["code"],
            "additionalProperties": False,
        },
    },
}]


def last_python_block(text):
    blocks = re.findall(r"```(?:python|py)?\n(.*?)```", text, re.S)
    return blocks[-1] if blocks else None


class Episode:
    def __init__(self):
        self.problem = None

    def describe(self, params):
        return {"protocol": "orrery-env/1", "name": "grade",
                "description": "write a program over numbers on stdin; hidden tests"}

    def reset(self, params):
        task = params["task"]
        offset = 0 if task["split"] == "train" else 1
        self.problem = NAMES[(2 * task["index"] + offset) % len(NAMES)]
        return {"messages": [
                    {"role": "system", "content": "You write Python 3 programs. Test them with "
                     "run_python, then give the final program in a ```python block."},
                    {"role": "user", "content": PROBLEMS[self.problem]["statement"]}],
                "tools": TOOLS}

    def step(self, params):
        args = params["tool_call"]["arguments"]
        run = orrery_isolated.run_isolated({"solution.py": args["code"]}, PYTHON,
                                           [args.get("stdin", "")])[0]
        text = run["stdout"] + ("\n[stderr]\n" + run["stderr"] if run["stderr"] else "")
        return {"content": f"{text}\n[{run['status']}]", "is_error": run["exit_code"] != 0}

    def score(self, params):
        final = ""
        for m in params["messages"]:
            if m["role"] == "assistant":
                final = m.get("content", "")
        tests = PROBLEMS[self.problem]["tests"]
        code = last_python_block(final)
        passed = 0
        if code is not None:
            runs = orrery_isolated.run_isolated({"solution.py": code}, PYTHON,
                                                [given for given, _ in tests])
            passed = sum(orrery_isolated.passed(r, want) for r, (_, want) in zip(runs, tests))
        return {"reward": passed / len(tests),
                "components": {"tests_passed": float(passed), "tests_total": float(len(tests))}}


def main():
    episode = Episode()
    for line in sys.stdin:
        try:
            request = json.loads(line)
        except json.JSONDecodeError:
            continue
        method, rid = request.get("method"), request.get("id")
        if method == "close":
            print(json.dumps({"jsonrpc": "2.0", "id": rid, "result": {}}), flush=True)
            return
        handler = getattr(episode, method, None) if method in (
            "describe", "reset", "step", "score") else None
        if handler is None:
            reply = {"jsonrpc": "2.0", "id": rid,
                     "error": {"code": -32601, "message": f"unknown method {method}"}}
        else:
            try:
                reply = {"jsonrpc": "2.0", "id": rid, "result": handler(request.get("params", {}))}
            except Exception as e:  # report, keep serving
                reply = {"jsonrpc": "2.0", "id": rid,
                         "error": {"code": -32000, "message": f"{type(e).__name__}: {e}"}}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
