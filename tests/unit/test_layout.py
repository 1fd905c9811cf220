"""The folders say the architecture, and this keeps them saying it (CONTRIBUTING.md, The rooms).

Every `import` in worker/ is read with `ast`, wherever it stands: at the top, inside a function
(the CLI's lazy imports), under `if TYPE_CHECKING:`. A type-only import is still a dependency a
reader has to follow, so it counts.

- every module is in a room: a folder (core, adapters, client, ops, devkit), the contract, the
  cross-cutting modules (config, errors, logs, metrics, tracing) or the composition (service.py,
  which wires the adapters into the core's loops, and settings.py, which checks the settings
  through the Postgres adapter); a new top-level module has to say which;
- the contract is pure: no worker module, nothing outside the standard library;
- the producer client (worker/client: TimerClient, its consumer, its envelopes, the NATS wire it
  owns) imports only the contract and itself (and nats-py, and OpenTelemetry's API, which it
  imports only when installed: worker/client/tracecontext.py);
- the core (worker/core) imports no adapter, no operator tool, no devkit, not the composition,
  and neither the database driver nor nats-py: it reads a received message through its own
  protocols (worker/core/received.py), which nats-py's Msg satisfies; nor does any module it
  reaches import either (the JetStream adapter tells errors.verdict of nats-py's errors, the
  Postgres adapter checks a conninfo for worker/settings.py);
- the cross-cutting modules import no adapter, no operator tool, no devkit, not the composition;
- adapters import no operator tool, no devkit, not the composition; the composition reaches
  neither an operator tool nor the devkit;
- no import circle among worker modules.

And the house stays one a newcomer finds things in: no module over MAX_LINES lines, and every
package's `__init__.py` docstring names each of its modules and folders, one line each (`name.py`
or `name/` at the start of a line, then what it holds), and names nothing that is not there.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

WORKER = Path(__file__).resolve().parents[2] / "worker"

ROOMS = {"core", "adapters", "ops", "devkit", "client"}
CROSS_CUTTING = {"config", "errors", "logs", "metrics", "tracing"}
# What wires the rooms together: the replica, and the settings every entry point loads.
COMPOSITION = {"service", "settings"}
MAX_LINES = 400
DATABASE = {"psycopg", "psycopg_pool", "psycopg_binary", "psycopg_c"}
# What the adapters wrap and the core never imports: the database driver and the NATS client.
ADAPTED = DATABASE | {"nats"}
# What the producer client may import: nats-py, and OpenTelemetry's API when a producer has it
# installed (never required: worker/client/tracecontext.py imports it guarded).
CLIENT_LIBRARIES = {"nats", "opentelemetry"}
# What no module the core reaches may import either: importing a module imports what it imports.
NEVER_REACHED = ADAPTED


@dataclass
class Module:
    name: str
    path: Path
    worker: set[str] = field(default_factory=set)  # worker modules it imports
    third_party: set[str] = field(default_factory=set)  # top-level names outside the stdlib


def module_name(root: Path, path: Path) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def read_package(root: Path = WORKER) -> dict[str, Module]:
    """Every module of the package at `root` and what it imports."""
    modules = {module_name(root, p): Module(module_name(root, p), p) for p in sorted(root.rglob("*.py"))}
    for m in modules.values():
        package = m.name if m.path.name == "__init__.py" else m.name.rpartition(".")[0]
        for node in ast.walk(ast.parse(m.path.read_text(encoding="utf-8"), str(m.path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, `level - 1` packages up
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*up, base] if base else up)
                # `from worker import metrics` imports the module worker.metrics, not the package
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in targets:
                top = target.partition(".")[0]
                if top == root.name:
                    found = _longest_known(target, modules)
                    if found and found != m.name:
                        m.worker.add(found)
                elif top not in sys.stdlib_module_names and top != "__future__":
                    m.third_party.add(top)
    return modules


def _longest_known(name: str, modules: dict[str, Module]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def layer(name: str) -> str:
    """core, adapters, ops, devkit, client, contract, composition, cross-cutting, package or
    "no room"."""
    parts = name.split(".")
    if len(parts) > 1 and parts[1] in ROOMS:
        return parts[1]
    if len(parts) == 1 or parts[1] == "__main__":
        return "package"
    if parts[1] in CROSS_CUTTING:
        return "cross-cutting"
    if parts[1] in COMPOSITION:
        return "composition"
    return "contract" if parts[1] == "contract" else "no room"


def reachable(start: Iterable[str], modules: dict[str, Module]) -> dict[str, list[str]]:
    """Every worker module reachable from `start`, with one import path to it."""
    paths = {s: [s] for s in start}
    todo = list(paths)
    while todo:
        here = todo.pop()
        for nxt in sorted(modules[here].worker):
            if nxt not in paths:
                paths[nxt] = [*paths[here], nxt]
                todo.append(nxt)
    return paths


def cycles(modules: dict[str, Module]) -> list[list[str]]:
    """The import circles: each strongly connected group of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(modules[v].worker):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(modules):
        if v not in index:
            visit(v)
    return found


def violations(modules: dict[str, Module], layer_of: Callable[[str], str] = layer) -> list[str]:
    """Every broken rule, one line each (empty when the layout holds)."""
    out: list[str] = []
    of = {name: layer_of(name) for name in modules}

    def refuse(layers: set[str], who: str, via: bool = False) -> None:
        for name in (n for n in modules if of[n] == who):
            if via:
                for target, path in reachable([name], modules).items():
                    if of[target] in layers and len(path) > 2:
                        out.append(f"{who} {name} reaches {of[target]} {target} via {' -> '.join(path)}")
            for target in sorted(modules[name].worker):
                if of[target] in layers:
                    out.append(f"{who} {name} imports {of[target]} {target}")

    for name, m in sorted(modules.items()):
        if of[name] == "no room":
            out.append(f"{name} is in no room: a folder, or ROOMS, CROSS_CUTTING or COMPOSITION here")
        if of[name] == "contract" and (m.worker or m.third_party):
            out.append(f"contract {name} is not pure: imports {sorted(m.worker | m.third_party)}")
        if of[name] == "client":
            extra = {t for t in m.worker if of[t] not in {"contract", "client"}}
            extra |= m.third_party - CLIENT_LIBRARIES
            if extra:
                out.append(f"client {name} imports more than the contract and the client: {sorted(extra)}")
        if of[name] == "core" and m.third_party & ADAPTED:
            out.append(f"core {name} imports an adapter's library: {sorted(m.third_party & ADAPTED)}")
        if of[name] == "core":
            for target, path in reachable([name], modules).items():
                # through an adapter: already refused as the core importing an adapter
                through_adapter = any(layer(p) == "adapters" for p in path)
                if (
                    len(path) > 1
                    and not through_adapter
                    and (found := modules[target].third_party & NEVER_REACHED)
                ):
                    out.append(f"core {name} reaches {sorted(found)} via {' -> '.join(path)}")
    refuse({"adapters", "ops", "devkit", "composition", "client"}, "core", via=True)
    refuse({"adapters", "ops", "devkit", "composition"}, "cross-cutting")
    refuse({"ops", "devkit", "composition"}, "adapters")
    refuse({"ops", "devkit"}, "composition", via=True)
    out += [f"import circle: {' <-> '.join(c)}" for c in cycles(modules)]
    return out


def too_long(root: Path = WORKER, limit: int = MAX_LINES) -> list[str]:
    """Every module over `limit` lines, one line each."""
    out = []
    for path in sorted(root.rglob("*.py")):
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > limit:
            out.append(f"{path.relative_to(root.parent)} has {n} lines, more than {limit}: split it")
    return out


# A docstring's entry: `name.py` or `name/` at the start of a line, then what it holds.
ENTRY = re.compile(r"^(\w+(?:\.py|/))[ \t]+\S", re.MULTILINE)


def unnamed(root: Path = WORKER) -> list[str]:
    """Every module or folder its package's docstring does not name, and every name it gives that
    is not there, one line each."""
    out = []
    for init in sorted(root.rglob("__init__.py")):
        package = init.parent
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        named = {m.group(1) for m in ENTRY.finditer(doc)}
        present = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
        present |= {f"{p.name}/" for p in package.iterdir() if p.is_dir() and p.name != "__pycache__"}
        where = init.relative_to(root.parent)
        out += [f"{where} does not name {n}" for n in sorted(present - named)]
        out += [f"{where} names {n}, which is not there" for n in sorted(named - present)]
    return out


def test_the_layout_holds() -> None:
    modules = read_package()
    expected = {"worker.core.domain", "worker.core.ports", "worker.adapters.postgres.store", "worker.ops.cli"}
    assert expected <= set(modules)
    assert violations(modules) == []


def test_the_reader_sees_every_kind_of_import(tmp_path: Path) -> None:
    """A rule is only as good as the imports it sees: type-only, lazy, relative, `from pkg import mod`."""
    root = tmp_path / "worker"
    (root / "core").mkdir(parents=True)
    (root / "adapters").mkdir()
    for f in ("__init__.py", "core/__init__.py", "adapters/__init__.py", "contract.py"):
        (root / f).write_text("")
    (root / "adapters/store.py").write_text("import psycopg\nfrom worker.core import loop\n")
    (root / "core/loop.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from worker.adapters.store import Store\n"
        "def f():\n    from ..contract import X\n"
    )
    modules = read_package(root)
    assert modules["worker.core.loop"].worker == {"worker.adapters.store", "worker.contract"}
    assert modules["worker.adapters.store"].worker == {"worker.core.loop"}
    assert modules["worker.adapters.store"].third_party == {"psycopg"}
    assert violations(modules) == [
        "core worker.core.loop imports adapters worker.adapters.store",
        "import circle: worker.adapters.store <-> worker.core.loop",
    ]


def test_the_core_may_import_neither_nats_nor_the_database_driver(tmp_path: Path) -> None:
    """Not even for a type: the core reads a message through its own protocols."""
    root = tmp_path / "worker"
    (root / "core").mkdir(parents=True)
    for f in ("__init__.py", "core/__init__.py"):
        (root / f).write_text("")
    (root / "core/intake.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from nats.aio.msg import Msg\n"
    )
    (root / "core/quota.py").write_text("def f():\n    import psycopg_pool\n")
    (root / "core/clock.py").write_text("import time\n")
    assert violations(read_package(root)) == [
        "core worker.core.intake imports an adapter's library: ['nats']",
        "core worker.core.quota imports an adapter's library: ['psycopg_pool']",
    ]


def test_the_core_may_not_reach_nats_or_the_driver_through_a_module_it_uses(tmp_path: Path) -> None:
    """errors.verdict knew nats-py's errors and config checked a conninfo with psycopg, so every
    loop imported both through them."""
    root = tmp_path / "worker"
    (root / "core").mkdir(parents=True)
    for f in ("__init__.py", "core/__init__.py"):
        (root / f).write_text("")
    (root / "config.py").write_text("from psycopg.conninfo import conninfo_to_dict\n")
    (root / "errors.py").write_text("import nats.errors\n")
    (root / "core/intake.py").write_text("from worker import config\nfrom worker.errors import verdict\n")
    assert sorted(violations(read_package(root))) == [
        "core worker.core.intake reaches ['nats'] via worker.core.intake -> worker.errors",
        "core worker.core.intake reaches ['psycopg'] via worker.core.intake -> worker.config",
    ]


def test_the_client_is_a_room_of_its_own(tmp_path: Path) -> None:
    """Every module of worker/client is the client's, and it imports the contract and itself only."""
    root = tmp_path / "worker"
    (root / "client").mkdir(parents=True)
    for f in ("__init__.py", "contract.py", "logs.py"):
        (root / f).write_text("")
    (root / "client/__init__.py").write_text("from worker.client.producer import TimerClient\n")
    (root / "client/producer.py").write_text(
        "import nats\nfrom worker.client.wire import x\nfrom worker import contract\n"
    )
    (root / "client/wire.py").write_text("import psycopg\nfrom worker import logs\n")
    modules = read_package(root)
    assert {layer(n) for n in modules if n.startswith("worker.client")} == {"client"}
    assert violations(modules) == [
        "client worker.client.wire imports more than the contract and the client: ['psycopg', 'worker.logs']",
    ]


def test_no_module_is_over_400_lines() -> None:
    """A module a newcomer reads in one sitting; past that, it has seams to split along."""
    assert too_long() == []


def test_a_module_over_the_limit_is_named_with_its_length(tmp_path: Path) -> None:
    root = tmp_path / "worker"
    (root / "core").mkdir(parents=True)
    (root / "core/short.py").write_text("x = 1\n" * MAX_LINES)
    (root / "core/long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    too = f"worker/core/long.py has {MAX_LINES + 1} lines, more than {MAX_LINES}: split it"
    assert too_long(root) == [too]


def test_every_package_docstring_names_each_of_its_modules() -> None:
    """The layout a newcomer reads is in the code, checked: no list elsewhere to go stale."""
    assert unnamed() == []


def test_a_module_or_folder_nobody_names_fails_and_so_does_a_stale_name(tmp_path: Path) -> None:
    root = tmp_path / "worker"
    (root / "core/deep").mkdir(parents=True)
    (root / "templates").mkdir()
    (root / "__init__.py").write_text(
        '"""The package.\n\ncore/  the loops\ngone.py  removed long ago\ntemplates/\n"""\n'
    )
    (root / "core/__init__.py").write_text('"""The core: clock.py is named in prose only."""\n')
    (root / "core/clock.py").write_text("")
    (root / "core/deep/__init__.py").write_text('"""Deep.\n\nx.py   what x holds\n"""\n')
    (root / "core/deep/x.py").write_text("")
    assert unnamed(root) == [
        "worker/__init__.py does not name templates/",  # named, but with nothing said of it
        "worker/__init__.py names gone.py, which is not there",
        "worker/core/__init__.py does not name clock.py",
        "worker/core/__init__.py does not name deep/",
    ]


def test_a_top_level_module_in_no_room_fails_and_the_composition_reaches_no_tool(tmp_path: Path) -> None:
    """settings.py imports the Postgres adapter: composition, like service.py, which the core, the
    cross-cutting modules and the adapters may not import."""
    root = tmp_path / "worker"
    for d in ("core", "adapters", "ops"):
        (root / d).mkdir(parents=True)
        (root / d / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "helpers.py").write_text("")
    (root / "adapters/db.py").write_text("")
    (root / "ops/cli.py").write_text("from worker.settings import load\n")
    (root / "settings.py").write_text("from worker.adapters import db\n")
    (root / "config.py").write_text("from worker import settings\n")
    (root / "core/intake.py").write_text("from worker.settings import load\n")
    (root / "service.py").write_text("def f():\n    from worker.ops import cli\n")
    assert sorted(violations(read_package(root))) == sorted(
        [
            "worker.helpers is in no room: a folder, or ROOMS, CROSS_CUTTING or COMPOSITION here",
            "core worker.core.intake imports composition worker.settings",
            "core worker.core.intake reaches adapters worker.adapters.db via "
            "worker.core.intake -> worker.settings -> worker.adapters.db",
            "cross-cutting worker.config imports composition worker.settings",
            "composition worker.service imports ops worker.ops.cli",
        ]
    )
