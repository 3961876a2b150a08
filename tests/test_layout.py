"""The package's layout (README "Layout"): no module over 400 lines, subpackages that import
only along the pipeline (so none imports another that imports it back), and a public name map
whose every entry resolves to the module that defines the name.

Imports are read from the source with ``ast``, function-local ones included, so an import
that only runs inside a function counts as much as one at the top of a module.
"""

import ast
import importlib
import re
from pathlib import Path

import ntk_tt

PACKAGE = Path(ntk_tt.__file__).resolve().parent
MAX_LINES = 400
# the stages in import order: each may import itself and those before it, never one after
# (README "Layout", whose table lists the subpackages in this order); "base" is the
# top-level modules below every stage (models, option checks, defaults, compile cache),
# "cli" the command line above them all
ORDER = ("base", "data", "kernels", "dynamics", "telemetry", "training", "prediction",
         "analysis", "sweep", "cli")


def _modules() -> dict[str, Path]:
    """Dotted module name → source file, for every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _stage(module: str) -> str | None:
    """The stage of a module of the package (None for the package itself, the name map)."""
    parts = module.split(".")
    if len(parts) == 1:
        return None
    if (PACKAGE / parts[1]).is_dir():
        return parts[1]
    return "cli" if parts[1] == "cli" or parts[1].startswith("_cli") else "base"


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of the package that ``module`` imports anywhere in its source: ``from
    ntk_tt.x import y`` (y a module or a name in x), ``import ntk_tt.x``, relative imports,
    and the public names of the lazy map (``from ntk_tt import predict``, or ``ntk_tt.predict``
    after ``import ntk_tt``) as the modules that define them."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found, attributes, whole_package = set(), set(), False
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            if base.split(".")[0] != "ntk_tt":
                continue
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    found.add(f"{base}.{alias.name}")
                elif base == "ntk_tt":  # a public name, or the package's own (__version__)
                    found.add(ntk_tt._EXPORTS.get(alias.name, "ntk_tt"))
                else:
                    found.add(base)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "ntk_tt":
                    whole_package = True
                elif alias.name.startswith("ntk_tt."):
                    found.add(alias.name)
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id == "ntk_tt" and node.attr in ntk_tt._EXPORTS):
            attributes.add(ntk_tt._EXPORTS[node.attr])
    if whole_package:
        found |= attributes
    found.discard(module)
    return found


def _stage_edges() -> dict[tuple[str, str], list[str]]:
    """(importing stage, imported stage) → the module imports behind it, between stages."""
    modules = _modules()
    edges: dict[tuple[str, str], list[str]] = {}
    for module, path in modules.items():
        src = _stage(module)
        if src is None:
            continue
        for target in sorted(_imports(module, path, modules)):
            dst = _stage(target)
            if dst is not None and dst != src:
                edges.setdefault((src, dst), []).append(f"{module} -> {target}")
    return edges


def _cycle(edges) -> list[str] | None:
    """A cycle of the stage graph (its stages, the first repeated at the end), or None."""
    graph: dict[str, set[str]] = {}
    for src, dst in edges:
        graph.setdefault(src, set()).add(dst)

    def walk(path):
        for nxt in sorted(graph.get(path[-1], ())):
            if nxt in path:
                return path[path.index(nxt):] + [nxt]
            if found := walk(path + [nxt]):
                return found
        return None

    return next((c for start in sorted(graph) if (c := walk([start]))), None)


def test_every_module_has_at_most_400_lines():
    too_long = {str(p.relative_to(PACKAGE.parent)): n for p in _modules().values()
                if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert too_long == {}, f"split these along their seams: {too_long}"


def test_every_module_belongs_to_a_stage_of_the_order():
    stages = {_stage(m) for m in _modules()} - {None}
    assert stages == set(ORDER), f"place the new stages in ORDER and README: {stages - set(ORDER)}"


def test_no_import_cycle_between_stages():
    edges = _stage_edges()
    cycle = _cycle(edges)
    hint = "" if cycle is None else "; ".join(
        f"{a} -> {b}: {edges[(a, b)][0]}" for a, b in zip(cycle, cycle[1:], strict=False))
    assert cycle is None, f"stages importing each other: {' -> '.join(cycle)} ({hint})"


def test_stages_import_only_earlier_stages():
    rank = {stage: i for i, stage in enumerate(ORDER)}
    upward = {f"{a} -> {b}": imports for (a, b), imports in _stage_edges().items()
              if rank[b] > rank[a]}
    assert upward == {}, f"imports up the pipeline (README 'Layout'): {upward}"


def test_readme_table_lists_the_subpackages_in_the_order():
    readme = (PACKAGE.parent / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Layout"):]
    section = section[:section.index("\n## ")]
    listed = re.findall(r"^\| `ntk_tt/(\w+)/` \|", section, flags=re.M)
    assert listed == [s for s in ORDER if (PACKAGE / s).is_dir()]


def test_the_stage_graph_is_read_from_the_source():
    """The reader itself, on imports this package has: a top-level one, a function-local
    one and a name of the lazy map (were any missed, the order tests would pass vacuously)."""
    modules = _modules()
    noise = _imports("ntk_tt.dynamics._noise", modules["ntk_tt.dynamics._noise"], modules)
    assert {"ntk_tt.data._model", "ntk_tt.dynamics._losses"} <= noise  # at the top
    assert "ntk_tt.kernels._sketch" in noise  # ``from ntk_tt import sketched_ntk``, in a function
    job = _imports("ntk_tt.prediction._job", modules["ntk_tt.prediction._job"], modules)
    assert {"ntk_tt.training._finetune", "ntk_tt.prediction._compare"} <= job
    edges = _stage_edges()
    assert ("prediction", "training") in edges and ("training", "prediction") not in edges


def test_every_public_name_resolves_to_the_module_that_defines_it():
    assert ntk_tt.__all__ == sorted(ntk_tt._EXPORTS)
    wrong = {}
    for name, module in ntk_tt._EXPORTS.items():
        value = getattr(importlib.import_module(module), name)
        assert getattr(ntk_tt, name) is value, name
        if getattr(value, "__module__", module) != module:
            wrong[name] = (module, value.__module__)
    assert wrong == {}, f"the lazy map names a module that only re-imports: {wrong}"
