#!/usr/bin/env python3
"""An example Orrery environment in plain Python (standard library only).

It speaks orrery-env/1 (docs/env-protocol.md): JSON-RPC 2.0 requests, one per line on stdin,
responses one per line on stdout. The task: find a secret integer in [1, 100] with the tool
guess(n), which answers "higher", "lower" or "correct". The reward is 1 when the final assistant
message ends with "Answer: <secret>", minus 0.05 per guess beyond the seventh (binary search needs
at most seven).
"""
import json
import random
import re
import sys

TOOLS = [{
    "type": "function",
    "function": {
        "name": "guess",
        "description": "Guess the secret number; answers higher, lower or correct.",
        "parameters": {
            "type": "object",
            "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 100}},
            "required": ["n"],
            "additionalProperties": False,
        },
    },
}]


class Episode:
    def __init__(self):
        self.secret = None
        self.guesses = 0

    def describe(self, params):
        return {"protocol": "orrery-env/1", "name": "guess",
                "description": "find a secret number in [1, 100] by guessing"}

    def reset(self, params):
        task = params["task"]
        # Disjoint splits: train secrets are odd, test secrets even.
        rng = random.Random(f"{task['seed']}/{task['split']}/{task['index']}")
        self.secret = 2 * rng.randrange(50) + (1 if task["split"] == "train" else 2)
        self.guesses = 0
        return {"messages": [
                    {"role": "system", "content": "Use the guess tool. End with 'Answer: <n>'."},
                    {"role": "user", "content": "I am thinking of a number from 1 to 100."}],
                "tools": TOOLS}

    def step(self, params):
        call = params["tool_call"]
        if call["name"] != "guess":
            return {"content": f"error: unknown tool {call['name']}", "is_error": True}
        n = call["arguments"]["n"]
        self.guesses += 1
        if n < self.secret:
            return {"content": "higher", "is_error": False}
        if n > self.secret:
            return {"content": "lower", "is_error": False}
        return {"content": "correct", "is_error": False}

    def score(self, params):
        final = ""
        for m in params["messages"]:
            if m["role"] == "assistant":
                final = m.get("content", "")
        found = re.findall(r"Answer:\s*(-?\d+)", final)
        correct = 1.0 if found and int(found[-1]) == self.secret else 0.0
        penalty = 0.05 * max(0, self.guesses - 7)
        return {"reward": max(0.0, correct - penalty),
                "components": {"correct": correct, "guesses": float(self.guesses)}}


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
