"""A complete environment in one file: a corner shop with three tools, six tasks, and its own checker.

It is the example of `docs/environments.md` and runs as any plugin does (`--env envace.envs.example:benchmark`;
`tests/test_plugins.py` installs a copy as a separate package). Everything a benchmark provides is here:
- tools as OpenAI function schemas (the workbench validates every call against them before `_dispatch`);
- tasks with user turns, a train/test split, a `group` for near-duplicates, and reference trajectories that
  are the gold calls executed on a fresh environment with the real results they got;
- `score`, which replays the calls it is given on fresh state (in rehearse mode nothing was executed) and
  grades the order: `success` when it is exactly the task's, `value` the share of its lines that are right.
"""

from __future__ import annotations

import json
from typing import Any

from envace.envs.base import Environment, Steps
from envace.envs.registry import Benchmark
from envace.types import ReferenceStep, Score, Task, ToolCall, ToolResult

PRICES = {"apple": 0.5, "bread": 2.0, "milk": 1.2, "pear": 0.6}
CATEGORY = "groceries"
SYSTEM_PROMPT = "You are a shop assistant. Use the tools to fill the customer's cart and check out when asked."


def _tool(name: str, description: str, properties: dict[str, Any] | None = None) -> dict[str, Any]:
    properties = properties or {}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": list(properties)}}}


TOOLS = [
    _tool("list_items", "The items for sale and their prices."),
    _tool("add_to_cart", "Put a quantity of one item in the cart.",
          {"item": {"type": "string", "enum": sorted(PRICES)}, "quantity": {"type": "integer"}}),
    _tool("checkout", "Pay for the cart and empty it; returns the order."),
]


class ShopEnv(Environment):
    """One customer's visit: a cart, and the orders paid so far."""

    def _setup(self, task: Task) -> None:
        self.cart: dict[str, int] = {}
        self.orders: list[dict[str, int]] = []

    def _dispatch(self, call: ToolCall) -> ToolResult:
        args = call.arguments
        if call.name == "list_items":
            return ToolResult(_json({"items": PRICES}))
        if call.name == "add_to_cart":
            if args["quantity"] < 1:  # the schema cannot say it; the tool refuses, as a real one would
                return ToolResult(_json({"error": "quantity must be at least 1"}), True, "TOOL_ERROR")
            self.cart[args["item"]] = self.cart.get(args["item"], 0) + args["quantity"]
            return ToolResult(_json({"cart": self.cart}))
        if not self.cart:  # checkout
            return ToolResult(_json({"error": "the cart is empty"}), True, "TOOL_ERROR")
        order, self.cart = self.cart, {}
        self.orders.append(order)
        return ToolResult(_json({"order": order, "total": round(sum(PRICES[i] * n for i, n in order.items()), 2)}))

    def score(self, task: Task, steps: Steps, texts: list[str] | None = None,
              termination: str = "completed") -> Score:
        replay = ShopEnv()
        replay.reset(task)
        for call in (c for turn in steps for step in turn for c in step):
            replay.execute(call)
        want: dict[str, int] = task.payload["order"]
        got = replay.orders[-1] if replay.orders else {}
        lines = sum(got.get(item) == n for item, n in want.items()) / len(want)
        exact = replay.orders == [want]
        detail = "" if exact else f"orders {replay.orders}, expected [{want}]"
        return Score(exact, detail, value=lines if replay.orders else 0.0,
                     subscores={"lines": lines, "paid": float(bool(replay.orders))})


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


# (user turns, gold calls per turn, the order it must end with, group); every 3rd task is test.
_ITEMS = [
    (["Two apples, please.", "That's all, check me out."],
     [[("add_to_cart", {"item": "apple", "quantity": 2})], [("checkout", {})]], {"apple": 2}, "apples"),
    (["I'd like two apples.", "Please check out."],
     [[("add_to_cart", {"item": "apple", "quantity": 2})], [("checkout", {})]], {"apple": 2}, "apples"),
    (["A loaf of bread and one milk, then check out."],
     [[("add_to_cart", {"item": "bread", "quantity": 1}), ("add_to_cart", {"item": "milk", "quantity": 1}),
       ("checkout", {})]], {"bread": 1, "milk": 1}, "breakfast"),
    (["What do you sell? Put three pears in my cart.", "Check out, thanks."],
     [[("list_items", {}), ("add_to_cart", {"item": "pear", "quantity": 3})], [("checkout", {})]],
     {"pear": 3}, "pears"),
    (["Zero apples and one bread, then pay."],
     [[("add_to_cart", {"item": "apple", "quantity": 0}), ("add_to_cart", {"item": "bread", "quantity": 1}),
       ("checkout", {})]], {"bread": 1}, "bread"),
    (["One milk.", "Pay now."],
     [[("add_to_cart", {"item": "milk", "quantity": 1})], [("checkout", {})]], {"milk": 1}, "milk"),
]


def _task(index: int) -> Task:
    turns, gold, order, group = _ITEMS[index]
    task = Task(uid=f"shop/{index}", env="shop", category=CATEGORY, split="test" if index % 3 == 2 else "train",
                scenario=index, system_prompt=SYSTEM_PROMPT, tools=TOOLS, user_turns=turns, reference=[],
                payload={"order": order}, group=f"shop/{group}")
    env = ShopEnv()
    env.reset(task)  # the reference is the gold replayed: each call with the real result it gets
    task.reference = [[ReferenceStep(ToolCall(name, args), env.execute(ToolCall(name, args))) for name, args in turn]
                      for turn in gold]
    return task


def load_tasks(category: str = CATEGORY, split: str = "test", limit: int | None = None, offset: int = 0) -> list[Task]:
    tasks = [t for t in map(_task, range(len(_ITEMS))) if split == "all" or t.split == split]
    return tasks[offset: None if limit is None else offset + limit]


def benchmark() -> Benchmark:
    """The entry point's target: a zero-argument factory returning the benchmark entry."""
    return Benchmark("shop", (CATEGORY,), CATEGORY, load_tasks, ShopEnv)
