"""`launch.runtime` knows no agent: importing any of its modules loads nothing of
agents, environments or vision, nor of the other parts of `launch` (d4pg, reporting,
cli), so the generic machinery stays usable by any program."""

from __future__ import annotations

import ast
import json
import os
import pkgutil
import subprocess
import sys

import pytest

import launch.runtime

pytestmark = pytest.mark.timeout(300)

FORBIDDEN = ("agents", "environments", "vision", "launch.d4pg", "launch.reporting", "launch.cli")
RUNTIME_MODULES = sorted(
    m.name for m in pkgutil.iter_modules(launch.runtime.__path__, "launch.runtime.")
)
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_LIST_MODULES = (
    "import importlib, json, sys\n"
    "importlib.import_module(sys.argv[1])\n"
    "print(json.dumps(sorted(sys.modules)))\n"
)


def _forbidden(names: list[str]) -> list[str]:
    return sorted(n for n in names if any(n == f or n.startswith(f + ".") for f in FORBIDDEN))


def test_every_runtime_module_is_checked():
    assert len(RUNTIME_MODULES) >= 14, RUNTIME_MODULES
    assert "launch.runtime.supervisor" in RUNTIME_MODULES


@pytest.mark.parametrize("module", RUNTIME_MODULES)
def test_importing_a_runtime_module_loads_no_agent_and_no_other_launch_part(module):
    # A fresh interpreter: this test process has imported everything already.
    out = subprocess.run(
        [sys.executable, "-c", _LIST_MODULES, module],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=_ROOT,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert _forbidden(loaded) == [], f"importing {module} loaded {_forbidden(loaded)}"


@pytest.mark.parametrize("module", RUNTIME_MODULES)
def test_no_runtime_module_imports_them_even_inside_a_function(module):
    # The import above sees only module-level imports; lazy ones run later, in nodes.
    path = os.path.join(_ROOT, *module.split(".")) + ".py"
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
            names += [f"{node.module}.{a.name}" for a in node.names]
    assert _forbidden(names) == [], f"{module} imports {_forbidden(names)}"
