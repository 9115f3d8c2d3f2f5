"""The package's import structure: arrows run one way, and the house rules of design.md hold.

Imports are read statically (every import statement, at any depth, lazy ones included), so a cycle
hidden inside a function still counts.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rlpipe"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imported_names(name: str) -> set[str]:
    """Every module name an import statement of ``name`` mentions (absolute, resolved)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return found


def internal_imports(name: str) -> set[str]:
    """The rlpipe modules ``name`` imports (a name resolves to the longest module it names)."""
    edges = set()
    for target in imported_names(name):
        while target and target not in MODULES:
            target = target.rpartition(".")[0]
        if target and target != name:
            edges.add(target)
    return edges


def test_no_import_cycles():
    graph = {name: internal_imports(name) for name in MODULES}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_walker_sees_lazy_imports():
    assert "rlpipe.agents.deployed" in internal_imports("rlpipe.agents")  # imported inside make_policy


@pytest.mark.parametrize("name", sorted(n for n in MODULES if not n.startswith(("rlpipe.runtime", "rlpipe.cli"))))
def test_only_the_cli_imports_the_runtime(name):
    assert not any(m.startswith("rlpipe.runtime") for m in internal_imports(name))


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("rlpipe.runtime")))
def test_the_runtime_never_imports_stable_baselines3(name):
    reached, frontier = set(), {name}
    while frontier:  # everything the module pulls in, transitively
        module = frontier.pop()
        reached.add(module)
        frontier |= internal_imports(module) - reached
    third_party = {t for m in reached for t in imported_names(m)}
    assert not any(t.startswith(("stable_baselines3", "sb3_contrib")) for t in third_party), sorted(reached)


@pytest.mark.parametrize("name", ["rlpipe.simulator", "rlpipe.envs.repartition", "rlpipe.observation",
                                  "rlpipe.planning", "rlpipe.partition", "rlpipe.interference"])
def test_simulator_and_environment_never_import_torch_distributed(name):
    assert not any(t.startswith("torch") for t in imported_names(name))
