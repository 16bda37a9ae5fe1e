"""The architecture holds (docs/ARCHITECTURE.md): layers only point down, no import cycles.

Every import counts: at module level, inside functions, and under
``TYPE_CHECKING``. A module may import its own layer or any layer below;
an import of a higher layer, or any cycle between modules, fails here with
the offending edge named.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Bottom to top. A module belongs to the first entry that is it or one of its packages.
LAYERS: list[tuple[str, list[str]]] = [
    ("errors", ["hqueue.errors"]),
    ("model and keys", ["hqueue.message", "hqueue.ids", "hqueue.config", "hqueue.batch", "hqueue.checks",
                        "hqueue.forks", "hqueue.backoff", "hqueue.scanner", "hqueue.auth", "hqueue.keys",
                        "hqueue.printed", "hqueue.api"]),
    ("storage, ownership, wire", ["hqueue.storage", "hqueue.coordination", "hqueue.rpc", "hqueue.metrics"]),
    ("engine core", ["hqueue.engine", "hqueue.events", "hqueue.writers", "hqueue.requests",
                     "hqueue.topic_index"]),
    ("services", ["hqueue.timers", "hqueue.groups", "hqueue.deadletters", "hqueue.lag",
                  "hqueue.subscriptions.registry", "hqueue.subscriptions.zk_registry",
                  "hqueue.subscriptions.store_registry", "hqueue.subscriptions.service",
                  "hqueue.subscriptions.delivery", "hqueue.subscriptions.manager", "hqueue.subscriptions.local",
                  "hqueue.subscriptions"]),
    ("attaching services, the client", ["hqueue.services", "hqueue.client", "hqueue.connection", "hqueue.sharing",
                                        "hqueue.aio.client", "hqueue.aio.executor", "hqueue.aio.connect"]),
    ("Python API", ["hqueue.queue", "hqueue.admin", "hqueue.consumer", "hqueue.producer", "hqueue.splits",
                    "hqueue.processor", "hqueue.subscriptions.listener", "hqueue.aio"]),
    ("console", ["hqueue.console"]),
    ("server", ["hqueue.server"]),
    ("commands both front ends share", ["hqueue.commands"]),
    ("front ends", ["hqueue.cli", "hqueue.shell", "hqueue"]),
]  # fmt: skip


def modules() -> dict[str, Path]:
    found = {}
    for path in (ROOT / "hqueue").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def layer_of(name: str) -> int:
    best, rank = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), index
    assert rank >= 0, f"{name} is in no layer: add it to LAYERS and to docs/ARCHITECTURE.md"
    return rank


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_every_import_points_to_the_same_layer_or_below():
    upward = [
        f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
        for a, targets in graph().items()
        for b in targets
        if layer_of(b) > layer_of(a)
    ]
    assert upward == []


def test_no_import_cycles():
    edges = graph()
    cycles, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for target in sorted(edges[node]):
            if state.get(target) == "open":
                cycles.append(path[path.index(target) :] + [target])
            elif target not in state:
                visit(target, [*path, target])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert cycles == [], "\n".join(" -> ".join(c) for c in cycles)


def test_the_map_names_every_layer_the_architecture_page_shows():
    page = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    for title, _ in LAYERS:
        assert title in page, f"docs/ARCHITECTURE.md does not name the layer {title!r}"
