"""The package's floors point one way (docs/architecture.md): a module imports only from its
own floor or below, and the two floor-3 rooms (train, rollout) do not import each other."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "credit"
FLOORS = {"cli": 5, "launch": 5, "plan": 4, "train": 3, "rollout": 3, "diagnostics": 3, "checkpoint": 2,
          "data": 2, "interop": 2, "config": 1, "models": 1, "parallel": 1, "kernels": 1, "logs": 1, "conf": 1,
          "compat": 0}


def _room(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def _imports(path: Path) -> list[str]:
    """Absolute `credit.*` modules imported anywhere in `path` (also inside functions)."""
    found = []
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this file's package
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                found.append(f"{base}.{node.module}" if node.module else base)
            elif node.module:
                found.append(node.module)
    return [m for m in found if m == "credit" or m.startswith("credit.")]


def test_every_room_has_a_floor():
    rooms = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if p.name != "__init__.py" and not p.name.startswith("__")}
    assert rooms <= set(FLOORS), rooms - set(FLOORS)


def test_imports_point_down_or_sideways_only():
    violations = []
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        room = _room(module)
        if room not in FLOORS:
            continue
        for target in _imports(path):
            other = _room(target)
            if other and FLOORS[other] > FLOORS[room]:
                violations.append(f"{module} (floor {FLOORS[room]}) imports {target} "
                                  f"(floor {FLOORS[other]})")
            if {room, other} == {"train", "rollout"}:
                violations.append(f"{module} imports {target}: train and rollout share floor 3")
    assert not violations, "\n".join(violations)
