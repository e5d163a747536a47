#!/usr/bin/env python3
"""shop: a multi-step Orrery environment in plain Python (the tutorial of docs/env.md).

The user asks what a basket costs ("3 plum and 2 fig"); the prices are behind the tool
price(item), so the model looks each item up (one step per item), then ends with
"Answer: <total>". Reward 1 for the right total, minus 0.1 per lookup beyond one per item.
It speaks orrery-env/1 (docs/env-protocol.md): one JSON-RPC request per line on stdin, one
response per line on stdout. Standard library only.
"""
import json
import random
import re
import sys

ITEMS = ["apple", "pear", "plum", "fig", "lime", "kiwi", "date", "melon"]
TOOLS = [{
    "type": "function",
    "function": {
        "name": "price",
        "description": "The price of one item, in cents.",
        "parameters": {
            "type": "object",
            "properties": {"item": {"type": "string", "enum": ITEMS}},
            "required": ["item"],
            "additionalProperties": False,
        },
    },
}]


class Shop:
    def describe(self, params):
        return {"protocol": "orrery-env/1", "name": "shop",
                "description": "look up prices, add up a basket"}

    def reset(self, params):
        task = params["task"]  # {"id", "split", "seed", "index"}: the task is a function of these
        rng = random.Random(f"{task['seed']}/{task['split']}/{task['index']}")
        self.prices = {item: rng.randint(1, 99) for item in ITEMS}
        first, second = rng.sample(ITEMS, 2)
        count = rng.randint(1, 4)
        # Disjoint splits: a train basket holds an even number of things, a test basket an odd one.
        other = rng.randint(1, 4)
        if (count + other) % 2 != (0 if task["split"] == "train" else 1):
            other += 1
        self.basket = {first: count, second: other}
        self.lookups = 0
        question = " and ".join(f"{n} {item}" for item, n in self.basket.items())
        return {"messages": [
                    {"role": "system", "content": "Look up prices with the price tool. "
                                                  "End with 'Answer: <total in cents>'."},
                    {"role": "user", "content": f"What do {question} cost?"}],
                "tools": TOOLS}

    def step(self, params):
        # Orrery has checked the call against the tool's schema: item is one of ITEMS.
        item = params["tool_call"]["arguments"]["item"]
        self.lookups += 1
        return {"content": f"{item}: {self.prices[item]} cents", "is_error": False}

    def score(self, params):
        # params["messages"]: the whole episode, the model's tool calls and the tool results too.
        final = ""
        for m in params["messages"]:
            if m["role"] == "assistant":
                final = m["content"]
        total = sum(self.prices[item] * n for item, n in self.basket.items())
        found = re.findall(r"Answer:\s*(-?\d+)", final)
        correct = 1.0 if found and int(found[-1]) == total else 0.0
        extra = max(0, self.lookups - len(self.basket))
        return {"reward": max(0.0, correct - 0.1 * extra),
                "components": {"correct": correct, "lookups": float(self.lookups)}}


def main():
    shop = Shop()
    for line in sys.stdin:
        request = json.loads(line)
        method, rid = request["method"], request["id"]
        if method == "close":
            print(json.dumps({"jsonrpc": "2.0", "id": rid, "result": {}}), flush=True)
            return
        try:
            result = getattr(shop, method)(request.get("params", {}))
            reply = {"jsonrpc": "2.0", "id": rid, "result": result}
        except Exception as e:  # an environment error: the episode fails, not the model
            reply = {"jsonrpc": "2.0", "id": rid,
                     "error": {"code": -32000, "message": f"{type(e).__name__}: {e}"}}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
