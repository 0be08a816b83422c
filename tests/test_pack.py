"""The pack imports cleanly without ComfyUI and the runtime never depends on ComfyUI."""

import importlib.util
import re
import subprocess
import sys

from conftest import ROOT

COMFY_IMPORT = re.compile(r"^\s*(from|import)\s+(comfy\w*|folder_paths|server|latent_preview|nodes)\b", re.M)


def test_runtime_never_imports_comfyui():
    offenders = [p.name for p in (ROOT / "cosmos3_runtime").glob("*.py") if COMFY_IMPORT.search(p.read_text())]
    assert offenders == []


def test_root_module_imports_without_comfyui():
    spec = importlib.util.spec_from_file_location("cosmos3_pack", ROOT / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert not hasattr(module, "NODE_CLASS_MAPPINGS")  # guarded: comfy_api is absent here
    assert not any(name == "comfy" or name.startswith("comfy.") for name in sys.modules)


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"(python[0-9.]* -m )?pytest[^`\n]*", readme).group(0).strip()
    assert command in (ROOT / ".ci" / "run").read_text()


def test_the_default_run_leaves_the_slow_tests_to_a_run_of_their_own_on_every_torch():
    """The README's command deselects the tests marked slow (pyproject.toml's addopts); .ci/run runs that command and
    then `-m slow`, on each torch it tests, so no test is left out of CI."""
    import shlex

    addopts = re.search(r'^addopts = "(.*)"$', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert " ".join(shlex.split(addopts)).endswith("-m not slow")
    ci = (ROOT / ".ci" / "run").read_text()
    for python in (".venv/bin/python", ".venv-torch27/bin/python"):
        assert f"\n{python} -m pytest tests -q\n{python} -m pytest tests -q -m slow\n" in ci + "\n"


def test_a_missing_reference_fails_under_ci_and_skips_locally():
    script = f"""
import os, sys
sys.path.insert(0, {str(ROOT / "tests")!r})
sys.modules["diffusers"] = None  # as if it were not installed
import conftest
for ci in ("true", ""):
    conftest.IN_CI = ci == "true"
    try:
        conftest.require("diffusers", minversion="0.42.1")
    except BaseException as exc:
        print(type(exc).__name__)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["ModuleNotFoundError", "Skipped"], done.stderr


def import_graph() -> dict[str, set[str]]:
    """Module -> the pack's modules it imports (module level and inside functions), for cosmos3_runtime and nodes.
    `from package import name` points at the submodule when `name` is one, else at the package's __init__."""
    import ast

    modules = {}
    for package in ("cosmos3_runtime", "nodes"):
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = ".".join(here[: len(here) - node.level + 1] + [node.module or ""] if node.level else [node.module])
                base = base.rstrip(".")
                for alias in node.names:
                    target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    if target in modules and target != name:
                        graph[name].add(target)
            elif isinstance(node, ast.Import):
                graph[name].update(a.name for a in node.names if a.name in modules and a.name != name)
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """An import cycle of the graph (the modules along it, the first one again at the end), or []."""
    done, path = set(), []

    def visit(module):  # depth first; a module met again on the current path closes a cycle
        if module in path:
            return path[path.index(module):] + [module]
        if module in done:
            return []
        path.append(module)
        for target in sorted(graph[module]):
            if found := visit(target):
                return found
        path.pop()
        done.add(module)
        return []

    return next((found for module in sorted(graph) if (found := visit(module))), [])


def test_the_import_graph_has_no_cycles_and_no_upward_imports():
    graph = import_graph()
    assert "cosmos3_runtime.pipeline" in graph["cosmos3_runtime"] and "nodes.serving.jobs" in graph["nodes.serving.chat"]
    upward = [(a, b) for a, targets in graph.items() if a.startswith("cosmos3_runtime") for b in targets
              if b.startswith("nodes")]
    assert upward == []
    assert cycle(graph) == []


def layer(module: str) -> str:
    """cosmos3_runtime, a subpackage of nodes (core, services, serving) or one of nodes' top-level modules."""
    parts = module.split(".")
    return parts[0] if parts[0] == "cosmos3_runtime" else ".".join(parts[:2])


def test_the_layers_of_nodes_import_downward_only():
    """No two layers import each other, even through a third (nodes.core imports the prompt widgets from
    nodes.prompting, which imports nothing of nodes, not from nodes.sampling, which imports nodes.core);
    nodes.services, the lowest, imports no other part of nodes."""
    layers = {}
    for module, targets in import_graph().items():
        layers.setdefault(layer(module), set()).update(layer(t) for t in targets if layer(t) != layer(module))
    assert "nodes.core" in layers["nodes.sampling"]
    assert [t for t in layers["nodes.services"] if t.startswith("nodes")] == []
    assert cycle(layers) == []


def test_every_runtime_module_has_tests_a_maintainer_finds_by_its_name():
    """Each module of cosmos3_runtime is imported by some test file, and `tests/test_<module>.py` (a subpackage's
    module: `test_<package>_<module>.py`), where it exists, imports the module it is named after: a module's tests
    are found by its name, and a module no test imports shows up here."""
    import ast

    runtime = {".".join(p.relative_to(ROOT / "cosmos3_runtime").with_suffix("").parts).removesuffix("__init__")
               .rstrip(".") for p in (ROOT / "cosmos3_runtime").rglob("*.py")}
    runtime.discard("")  # the package itself
    imported: dict[str, set[str]] = {}
    for path in (ROOT / "tests").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cosmos3_runtime"):
                base = node.module.removeprefix("cosmos3_runtime").lstrip(".")
                names = [base] + [f"{base}.{a.name}".lstrip(".") for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name.removeprefix("cosmos3_runtime.") for a in node.names if a.name.startswith("cosmos3_runtime.")]
            for name in names:
                imported.setdefault(name, set()).add(path.name)
    untested = sorted(m for m in runtime if m not in imported)
    assert untested == [], f"no test file imports {untested}"
    misnamed = sorted(m for m in runtime if (ROOT / "tests" / f"test_{m.replace('.', '_')}.py").exists()
                      and f"test_{m.replace('.', '_')}.py" not in imported.get(m, ()))
    assert misnamed == [], f"test files named after these modules do not import them: {misnamed}"
