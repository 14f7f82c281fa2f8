"""The house's import rules (docs/architecture.md, Layout and import rules), checked on the
source: arrows only point down."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "zbrl"


def _imports(path: Path) -> set[str]:
    """Every module named by an import statement of ``path`` (top level or inside functions)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _modules(package: str) -> list[Path]:
    root = SRC / package
    return sorted(root.rglob("*.py")) if root.is_dir() else [SRC / f"{package}.py"]


def _matches(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _violations(packages: list[str], prefixes: tuple[str, ...]) -> list[str]:
    return [
        f"{path.relative_to(SRC)} imports {name}"
        for package in packages
        for path in _modules(package)
        for name in sorted(_imports(path))
        if _matches(name, prefixes)
    ]


BELOW_LAUNCH = [
    p.name if p.is_dir() else p.stem
    for p in SRC.iterdir()
    if p.name not in ("launch", "cli.py", "__pycache__", "py.typed", "__init__.py")
]


def test_only_the_cli_imports_launch() -> None:
    """``launch`` turns components into actors; nothing below it may import it."""
    assert "assembly" in BELOW_LAUNCH and "evaluation" in BELOW_LAUNCH
    assert _violations(BELOW_LAUNCH, ("zbrl.launch",)) == []


@pytest.mark.parametrize(
    "package",
    ["config", "types", "rewards", "environments", "algorithms", "assembly", "data", "training"],
)
def test_no_ray_below_launch(package: str) -> None:
    assert _violations([package], ("ray",)) == []


@pytest.mark.parametrize("package", ["config", "types", "rewards", "environments", "algorithms"])
def test_no_torch_distributed_in_pure_packages(package: str) -> None:
    assert _violations([package], ("torch.distributed",)) == []


def test_the_sandbox_stands_below_rewards_and_environments() -> None:
    """``sandbox`` imports no zbrl package but ``errors`` (the code reward and the Python tool
    stand on it)."""
    others = tuple(f"zbrl.{p}" for p in BELOW_LAUNCH if p not in ("sandbox", "errors"))
    assert _violations(["sandbox"], (*others, "zbrl.launch")) == []


def test_the_rule_sees_a_violation(tmp_path: Path) -> None:
    """The scanner itself finds imports inside functions (so the tests above can fail)."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from zbrl.launch.driver import run_training\n    import ray\n")
    assert _matches("zbrl.launch.driver", ("zbrl.launch",))
    assert {"zbrl.launch.driver", "ray"} <= _imports(module)
    assert not _matches("zbrl.launcher", ("zbrl.launch",))


def _module_imports(path: Path) -> set[str]:
    """Modules ``path`` imports, wherever the import stands (top level, ``if TYPE_CHECKING:``
    blocks, inside functions): ``from a.b import c`` names ``a.b`` and ``a.b.c``. A lazy import
    keeps a process light; it is not a way around the rules below."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _import_cycles() -> list[list[str]]:
    """Import circles between modules (package ``__init__`` files, which re-export their
    submodules, are left out): each strongly connected component of more than one module."""
    modules = {
        "zbrl." + ".".join(path.relative_to(SRC).with_suffix("").parts): path
        for path in SRC.rglob("*.py")
        if path.name != "__init__.py"
    }
    graph = {
        name: _module_imports(path) & modules.keys() - {name} for name, path in modules.items()
    }
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def connect(name: str) -> None:  # Tarjan's algorithm
        order[name] = low[name] = len(order)
        stack.append(name)
        for other in graph[name]:
            if other not in order:
                connect(other)
                low[name] = min(low[name], low[other])
            elif other in stack:
                low[name] = min(low[name], order[other])
        if low[name] == order[name]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == name:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for name in sorted(graph):
        if name not in order:
            connect(name)
    return cycles


def test_no_two_modules_import_each_other_even_inside_functions() -> None:
    assert _import_cycles() == []


def test_the_cycle_finder_sees_circles_through_type_checking_and_functions(
    tmp_path, monkeypatch
) -> None:
    package = tmp_path / "zbrl"
    package.mkdir()
    (package / "a.py").write_text("from zbrl.b import B\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from zbrl.a import A\nB = 1\n"
    )
    (package / "c.py").write_text("def f():\n    from zbrl.d import D\n")
    (package / "d.py").write_text("from zbrl.c import f\nD = 1\n")
    (package / "e.py").write_text("from zbrl.a import A\n")
    monkeypatch.setattr(f"{__name__}.SRC", package)
    assert _import_cycles() == [["zbrl.a", "zbrl.b"], ["zbrl.c", "zbrl.d"]]


# --- floors: the rooms of src/zbrl, each on a floor, as drawn in docs/architecture.md ----------

ARCHITECTURE = SRC.parents[1] / "docs" / "architecture.md"
FLOOR_ROW = re.compile(r"^\| *(\d+) *\| *([a-z_ ,]+?) *\|")


def _floors(doc: Path) -> dict[str, int]:
    """The floor of each room, read from the floors table of ``doc`` (``| 3 | rewards, data |``)."""
    floors: dict[str, int] = {}
    for line in doc.read_text(encoding="utf-8").splitlines():
        match = FLOOR_ROW.match(line)
        if match:
            for room in match.group(2).split(","):
                assert room.strip() not in floors, f"{room.strip()} is on two floors in {doc}"
                floors[room.strip()] = int(match.group(1))
    return floors


def _room(module: str) -> str:
    """``zbrl.rollout.backends.base`` -> ``rollout``; ``zbrl.types`` -> ``types``."""
    return module.split(".")[1]


def _rooms(src: Path) -> set[str]:
    return {
        p.name if p.is_dir() else p.stem
        for p in src.iterdir()
        if (p.is_dir() and any(p.rglob("*.py"))) or (p.suffix == ".py" and p.name != "__init__.py")
    }


def _upward_imports(src: Path, floors: dict[str, int]) -> list[str]:
    """Each import (wherever it stands) from a room to a room on the same or a higher floor."""
    found = []
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if parts == ("__init__",):
            continue
        room = parts[0]
        for name in sorted(_imports(path)):
            if not name.startswith("zbrl.") or name.count(".") < 1:
                continue
            other = _room(name)
            if other != room and other in floors and floors[other] >= floors[room]:
                found.append(
                    f"{path.relative_to(src)} (floor {floors[room]}) imports {name} "
                    f"(floor {floors[other]})"
                )
    return found


def test_every_room_is_on_a_floor() -> None:
    floors = _floors(ARCHITECTURE)
    assert _rooms(SRC) == set(floors), "docs/architecture.md's floors table and src/zbrl differ"


def test_imports_point_down_the_floors() -> None:
    assert _upward_imports(SRC, _floors(ARCHITECTURE)) == []


def test_the_floor_rule_sees_a_lazy_import_running_up(tmp_path: Path) -> None:
    src = tmp_path / "zbrl"
    for room in ("low", "high"):
        (src / room).mkdir(parents=True)
        (src / room / "__init__.py").write_text("")
    (src / "high" / "a.py").write_text("from zbrl.low.b import B\n")
    (src / "low" / "b.py").write_text("B = 1\ndef f():\n    from zbrl.high.a import A\n")
    doc = tmp_path / "architecture.md"
    doc.write_text("| floor | rooms |\n|---|---|\n| 2 | high |\n| 1 | low |\n")
    assert _floors(doc) == {"high": 2, "low": 1}
    assert _rooms(src) == {"high", "low"}
    assert _upward_imports(src, _floors(doc)) == [
        "low/b.py (floor 1) imports zbrl.high.a (floor 2)"
    ]
