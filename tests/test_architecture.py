"""The shape of the code: arrows point down (`apps → workbench → envace`) and no module imports itself back.

Every import counts, at module level or inside a function: a lazy import is still an arrow.
"""

import ast
from pathlib import Path

LAYERS = ("envace", "workbench", "apps")  # each may import only the ones before it (and itself)


def _graph() -> dict[str, set[str]]:
    files = [f for layer in LAYERS for f in Path(layer).rglob("*.py")]
    modules = {".".join(f.with_suffix("").parts).removesuffix(".__init__"): f for f in files}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolve against the importing package
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for target in targets:
                # the module itself, or the package that holds it
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_another_that_imports_it_back():
    assert _cycles(_graph()) == []


def test_arrows_point_down():
    upward = [(a, b) for a, targets in _graph().items() for b in targets
              if LAYERS.index(b.split(".")[0]) > LAYERS.index(a.split(".")[0])]
    assert upward == []


def test_the_checks_catch_what_they_are_for():
    """The walker itself: a cycle and an upward arrow in a made-up graph are found."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]
    graph = _graph()
    assert "envace.engine.worlds" in graph["envace.engine.rollout"]  # lazy and module-level imports count
    assert "envace.config" in graph["envace.jobs"]
