"""The package's import graph, read from the source (every import statement, lazy ones inside
functions too): no cycle anywhere in vcbench, and the kernel layers import one way only,
spec <- reference <- backends <- vcbench.kernels, with nothing under kernels/ importing the
package that sees all three."""

import ast
from pathlib import Path

import vcbench

ROOT = Path(vcbench.__file__).resolve().parent
LAYERS = ("vcbench.kernels.spec", "vcbench.kernels.reference", "vcbench.kernels.backends")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                # `from pkg import mod` names a module when mod is one
                found = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                         for a in node.names]
            else:
                continue
            targets |= {t for t in found if t in modules and t != name}
        edges[name] = targets
    return edges


def test_the_graph_is_read():
    g = graph()
    assert "vcbench.kernels.reference.engine" in g["vcbench.kernels"]
    assert "vcbench.kernels.spec.method" in g["vcbench.kernels.reference.engine"]


def test_no_import_cycle():
    g = graph()
    state: dict[str, int] = {}  # 1 on the stack, 2 done

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(g[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(g):
        if node not in state:
            visit(node, [node])


def layer(module: str) -> int | None:
    for i, prefix in enumerate(LAYERS):
        if module == prefix or module.startswith(prefix + "."):
            return i
    return None


def test_kernel_layers_import_one_way():
    for src, targets in graph().items():
        own = layer(src)
        if own is None:
            continue
        for dst in targets:
            assert dst != "vcbench.kernels", f"{src} imports vcbench.kernels (it sees every layer)"
            other = layer(dst)
            if other is not None:
                assert other <= own, f"{src} ({LAYERS[own]}) imports {dst} ({LAYERS[other]})"
    # and spec is data: it imports nothing of vcbench but itself and errors
    for src, targets in graph().items():
        if layer(src) == 0:
            assert all(layer(t) == 0 or t == "vcbench.errors" for t in targets), (src, targets)
