"""The shape of the code: arrows point down (`apps → workbench → envace`), no module imports itself back, and no
package of `envace` imports one that imports it back.

Every import counts, at module level or inside a function: a lazy import is still an arrow.
"""

import ast
from pathlib import Path

LAYERS = ("envace", "workbench", "apps")  # each may import only the ones before it (and itself)


def _graph(root: Path = Path(".")) -> dict[str, set[str]]:
    """Every module of the tree at `root` and the modules it imports."""
    files = [f for layer in LAYERS for f in (root / layer).rglob("*.py")]
    modules = {".".join(f.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): f for f in files}
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


def _package_graph(root: Path = Path(".")) -> dict[str, set[str]]:
    """`envace`'s packages and top-level modules, and which import which.

    A node is a package (a folder with `__init__.py`: `envace.engine`, `envace.training.cluster`) or a module
    directly in `envace/` (`envace.config`). A subpackage is part of the package that holds it, both ways: an
    arrow out of or into `envace.training.cluster` is one out of or into `envace.training` too, so a cycle
    cannot hide behind a subpackage (`training → jobs → training.cluster`). Being parts of it, a package's
    subpackages are not its pair: the arrows between them stay inside it (`envs/registry.py` names `envs/bfcl/`,
    which builds on `envs/base.py`), where the module-level test checks them. Sibling subpackages are pairs.
    """
    packages = {".".join(f.parent.relative_to(root).parts) for f in (root / "envace").rglob("__init__.py")}

    def node(module: str) -> str:  # the innermost package holding the module, or a top-level module itself
        while module not in packages and module.count(".") > 1:
            module = module.rpartition(".")[0]
        return module

    def holders(name: str) -> list[str]:  # the node and every package above it, below `envace`
        return [".".join(name.split(".")[:i]) for i in range(name.count(".") + 1, 1, -1)]

    graph: dict[str, set[str]] = {}
    for module, targets in _graph(root).items():
        if not module.startswith("envace."):
            continue
        for a in holders(node(module)):
            graph.setdefault(a, set())
            for b in (b for t in targets if t.startswith("envace.") for b in holders(node(t))):
                if not (a == b or a.startswith(b + ".") or b.startswith(a + ".")):
                    graph[a].add(b)
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


def test_no_package_imports_another_that_imports_it_back():
    assert _cycles(_package_graph()) == []


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


def test_the_package_check_catches_what_it_is_for(tmp_path):
    """Package cycles in a made-up tree: a lazy one through a subpackage, and one through a top-level module."""
    files = {
        "envace/__init__.py": "",
        "envace/low/__init__.py": "",
        "envace/low/parts/__init__.py": "",
        "envace/low/parts/deep.py": "def f():\n    from envace.high import top\n",  # lazy, in a subpackage
        "envace/low/base.py": "",
        "envace/high/__init__.py": "",
        "envace/high/top.py": "from envace.low import base\n",
        "envace/glue.py": "from envace.low.base import x\n",
        "envace/lone/__init__.py": "from envace import glue\nfrom envace.lone.sub import back\n",
        "envace/lone/sub/__init__.py": "",
        "envace/lone/sub/back.py": "import envace.lone.sub\nfrom envace.lone import y\n",  # inside `lone`: no pair
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert _cycles(_package_graph(tmp_path)) == [["envace.high", "envace.low"]]
    (tmp_path / "envace/low/base.py").write_text("from envace.lone.sub import back\n")  # into `lone`, through its part
    assert _cycles(_package_graph(tmp_path)) == [["envace.glue", "envace.high", "envace.lone", "envace.low"]]


def test_the_structure_figures_count_rooms_floors_and_cycles():
    """`experiments/structure.py` (the numbers a review quotes) on a made-up tree: a lazy, relative import closes a
    cycle that counts as one floor, and each room that imports it stands one floor higher."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("structure", "experiments/structure.py")
    structure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(structure)
    files = {
        "envace/__init__.py": "",
        "envace/b/__init__.py": "",
        "envace/b/inner.py": "def f():\n    from ..c import y\n    return y\n",  # lazy and relative: still an arrow
        "envace/c.py": "from envace.b import inner\n",
        "envace/a.py": "import envace.b.inner\n",
        "envace/d.py": "from envace import a\n",
    }
    found = structure.measure(files)
    assert found["rooms"] == 5 and found["floors"] == 3  # {b, c} and envace on 1, a on 2, d on 3
    assert found["cycles"] == [["envace.b", "envace.c"]]
    assert found["longest function"] == "envace/b/inner.py:f (3 lines)"
