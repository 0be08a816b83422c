"""Every torch name the pack's shipped code uses exists in the installed torch, unless the code guards it.

The pack supports torch 2.7 and newer (pyproject.toml), and CI runs the tests on 2.7.1 and 2.13.0 (.ci/run). A
name that only a newer torch has crashes only the code path that reaches it, which the tests may never run on the
older torch: `torch.accelerator.empty_host_cache()` (torch 2.12+) once crashed every block swap release on 2.7.
So every attribute chain rooted at a name bound to torch (`torch.x.y`, `F.scaled_dot_product_attention`,
`nn.Module`) and every `from torch.x import y` in the files ComfyUI loads is resolved here, statically.

Guarded uses pass, as cosmos3_runtime/devices.py writes them: `getattr(obj, "name", default)` and
`hasattr(obj, "name")` (the missing name only ever a string), code under `if hasattr(obj, "name")` that uses
exactly that name, and code inside `try:` whose handlers catch the error a missing name raises (AttributeError;
ImportError for imports).
"""

import ast
import functools
import importlib
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = [ROOT / "__init__.py", *sorted((ROOT / "cosmos3_runtime").rglob("*.py")),
           *sorted((ROOT / "nodes").rglob("*.py"))]  # what ComfyUI loads (not tests/, benchmarks/)
CATCH_ALL = {"Exception", "BaseException"}


@functools.lru_cache(maxsize=None)
def missing_prefix(path: str) -> str | None:
    """The shortest prefix of dotted `path` that the installed torch lacks (None: all of it resolves). A module's
    submodule is imported when it is not an attribute yet (`torch.utils.flop_counter`)."""
    parts = path.split(".")
    found = importlib.import_module(parts[0])
    for end in range(2, len(parts) + 1):
        part = parts[end - 1]
        try:
            found = getattr(found, part)
        except AttributeError:
            if not isinstance(found, types.ModuleType):
                return ".".join(parts[:end])
            try:
                found = importlib.import_module(f"{found.__name__}.{part}")
            except ImportError:
                return ".".join(parts[:end])
    return None


class _Guard:
    """What the enclosing code guards: dotted paths checked by `hasattr`, and the errors a `try` catches."""

    def __init__(self, paths=frozenset(), attribute=False, imports=False):
        self.paths, self.attribute, self.imports = paths, attribute, imports

    def with_paths(self, paths):
        return _Guard(self.paths | paths, self.attribute, self.imports) if paths else self

    def catching(self, handlers):
        caught = set()
        for handler in handlers:
            kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
            caught |= {"BaseException" if kind is None else getattr(kind, "id", getattr(kind, "attr", None))
                       for kind in kinds}  # (None: a bare except)
        caught_all = bool(caught & CATCH_ALL)
        return _Guard(self.paths, self.attribute or caught_all or "AttributeError" in caught,
                      self.imports or caught_all or bool(caught & {"ImportError", "ModuleNotFoundError"}))


class _TorchUses(ast.NodeVisitor):
    """Collects (line, dotted torch path, kind, guard) for every torch name a module's source uses."""

    def __init__(self, tree: ast.AST):
        self.aliases = _aliases(tree)
        self.uses = []
        self.guard = _Guard()
        self.visit(tree)

    def path(self, node) -> str | None:
        """`node` as a dotted torch path (`F.silu` -> torch.nn.functional.silu); None when it is not rooted at torch."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.path(node.value)
            return base and f"{base}.{node.attr}"
        return None

    def use(self, node, path, kind="attribute"):
        self.uses.append((node.lineno, path, kind, self.guard))

    def guarded(self, guard, nodes):
        outer, self.guard = self.guard, guard
        for node in nodes:
            self.visit(node)
        self.guard = outer

    def hasattr_paths(self, test, negated=False) -> frozenset:
        """The paths that `test` being true (false, when negated) proves exist: `hasattr(torch.x, "y")`, also in
        an `and` (an `or` when negated)."""
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return self.hasattr_paths(test.operand, not negated)
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or if negated else ast.And):
            return frozenset().union(*(self.hasattr_paths(value, negated) for value in test.values))
        probed = _probe(test, "hasattr")
        if negated or probed is None:
            return frozenset()
        base = self.path(probed[0])
        return frozenset({f"{base}.{probed[1]}"} if base else ())

    def visit_Import(self, node):
        for alias in node.names:
            if alias.name.split(".")[0] == "torch":
                self.use(node, alias.name, "import")

    def visit_ImportFrom(self, node):
        if node.level == 0 and node.module.split(".")[0] == "torch":
            for alias in node.names:
                if alias.name != "*":
                    self.use(node, f"{node.module}.{alias.name}", "import")

    def visit_Attribute(self, node):
        path = self.path(node)
        if path is None:  # a chain on a value (`torch.finfo(dtype).bits`): its torch part is checked inside
            self.generic_visit(node)
        else:
            self.use(node, path)

    def visit_Call(self, node):
        probed = _probe(node, "getattr") or _probe(node, "hasattr")
        base = probed and self.path(probed[0])
        if base and node.func.id == "getattr" and len(node.args) == 2:  # no default: the name must exist
            self.use(node, f"{base}.{probed[1]}")
        self.generic_visit(node)

    def visit_Try(self, node):
        self.guarded(self.guard.catching(node.handlers), node.body)
        self.guarded(self.guard, node.handlers + node.orelse + node.finalbody)

    def visit_FunctionDef(self, node):
        """A def's body runs after a `try` around the def has ended: only `hasattr` guards reach it."""
        self.guarded(self.guard, node.decorator_list + [node.args] + ([node.returns] if node.returns else []))
        self.guarded(_Guard(self.guard.paths), node.body)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_If(self, node):
        self.visit(node.test)
        for branch, negated in ((node.body, False), (node.orelse, True)):
            branch = branch if isinstance(branch, list) else [branch]  # (an IfExp's branches are expressions)
            self.guarded(self.guard.with_paths(self.hasattr_paths(node.test, negated)), branch)

    visit_IfExp = visit_If

    def visit_BoolOp(self, node):
        outer = self.guard
        for index, value in enumerate(node.values):
            self.guarded(outer.with_paths(self.hasattr_paths(ast.BoolOp(node.op, node.values[:index]),
                                                             negated=isinstance(node.op, ast.Or))), [value])


def _aliases(tree: ast.AST) -> dict[str, str]:
    """The module's local names bound to torch: `import torch.nn.functional as F` -> {"F": "torch.nn.functional"}."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch":
                    aliases[alias.asname or "torch"] = alias.name if alias.asname else "torch"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] == "torch":
            aliases.update({alias.asname or alias.name: f"{node.module}.{alias.name}" for alias in node.names})
    return aliases


def _probe(node, function: str):
    """(object, name) of a `getattr(object, "name", ...)` / `hasattr(object, "name")` call, else None."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == function
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
        return node.args[0], node.args[1].value
    return None


def unresolved(source: str, filename: str = "<source>") -> tuple[int, list[str]]:
    """How many torch uses `source` has, and those the installed torch lacks without a guard ("file:line: ...")."""
    uses = _TorchUses(ast.parse(source, filename)).uses
    problems = []
    for line, path, kind, guard in uses:
        missing = missing_prefix(path)
        if missing is None or missing in guard.paths or (guard.imports if kind == "import" else guard.attribute):
            continue
        problems.append(f"{filename}:{line}: {path} ({missing} is missing)")
    return len(uses), problems


def test_every_torch_name_in_the_shipped_code_exists_in_this_torch():
    checked, problems = 0, []
    for file in SHIPPED:
        count, found = unresolved(file.read_text(), str(file.relative_to(ROOT)))
        checked, problems = checked + count, problems + found
    assert checked >= 300, f"only {checked} torch uses found: the checker misses the pack's imports"
    assert not problems, f"torch {torch.__version__} lacks names the pack uses unguarded:\n" + "\n".join(problems)


def test_a_missing_name_is_flagged_unless_it_is_guarded():
    flagged = ["import torch\ntorch.accelerator.no_such_thing()",
               "import torch.nn.functional as F\nF.no_such_thing(x)",
               "from torch import nn\nclass M(nn.NoSuchModule): pass",
               "from torch.nn import no_such_thing",
               "import torch\ngetattr(torch.accelerator, 'no_such_thing')()",
               "import torch\nif hasattr(torch, 'accelerator'):\n    torch.accelerator.no_such_thing()",
               "import torch\ntry:\n    torch.no_such_thing()\nexcept RuntimeError:\n    pass",
               "import torch\ntry:\n    def f():\n        torch.no_such_thing()\nexcept AttributeError:\n    pass"]
    guarded = ["import torch\ngetattr(torch.accelerator, 'no_such_thing', None)",
               "import torch\nhasattr(torch.accelerator, 'no_such_thing')",
               "import torch\nif hasattr(torch.accelerator, 'no_such_thing'):\n    torch.accelerator.no_such_thing()",
               "import torch\nok = hasattr(torch, 'no_such_thing') and torch.no_such_thing()",
               "import torch\nif not hasattr(torch, 'no_such_thing'):\n    pass\nelse:\n    torch.no_such_thing()",
               "import torch\ntry:\n    torch.no_such_thing()\nexcept (RuntimeError, AttributeError):\n    pass",
               "try:\n    from torch.nn import no_such_thing\nexcept ImportError:\n    no_such_thing = None",
               "import torch\ntorch.finfo(torch.float16).no_such_thing"]
    for source in flagged:
        assert unresolved(source)[1], source
    for source in guarded:
        assert unresolved(source)[1] == [], source
