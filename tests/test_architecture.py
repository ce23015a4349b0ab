"""The import graph: no cycle between tfdml's modules (the layers contract in setup.cfg, run by
`lint-imports`, forbids upward imports between layers; this also covers cycles inside a layer), a
configuration error is found before TensorFlow is imported (the CLI answers at once), the library names
no benchmark while the tests import none, and a name with a leading underscore is imported inside its own
package only."""

import ast
import os
import re
import subprocess
import sys

import grimp
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cycles(graph):
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_cycle_finder_finds_a_planted_cycle():
    class Graph:
        modules = {"a", "b", "c", "d"}
        edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}

        def find_modules_directly_imported_by(self, module):
            return self.edges[module]

    assert _cycles(Graph()) == [["a", "b", "c"]]


def test_no_import_cycle_between_tfdml_modules():
    graph = grimp.build_graph("tfdml")
    assert len(graph.modules) > 50
    assert _cycles(graph) == []


def test_configuration_errors_are_found_before_tensorflow_is_imported():
    code = (
        "import sys, tfdml.config as c\n"
        "try:\n    c.load_config(overrides=['training.epoch=2'])\n"
        "except c.ConfigError as e:\n    print(e)\n"
        "print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    message, imported = out.splitlines()
    assert message.startswith("unknown configuration key 'training.epoch' (did you mean 'epochs'?)")
    assert imported == "[]"


def _sources(folder):
    """`{path relative to the top folder: source}` of the Python files under `folder`."""
    found = {}
    for where, _, names in os.walk(os.path.join(ROOT, folder)):
        for name in sorted(names):
            if name.endswith(".py"):
                path = os.path.join(where, name)
                with open(path, encoding="utf-8") as f:
                    found[os.path.relpath(path, ROOT)] = f.read()
    return found


def _imported_modules(source):
    """The modules a source file imports (`import a.b`, `from a.b import c`; relative imports left out)."""
    modules = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            modules.append(node.module)
    return modules


@pytest.mark.slow
def test_the_library_names_no_benchmark_and_the_tests_import_none():
    """Research stays out of the library: no tfdml module names the benchmarks' folder (a page of the
    documentation does), and no test under tests/ imports a benchmark (the benchmarks' own tests live beside
    them, in benchmarks/, which the test command also collects)."""
    naming = [path for path, source in _sources("tfdml").items() if re.search(r"\bbenchmarks(/|\.\w)", source)]
    assert not naming, f"library modules that name benchmarks/: {naming}"
    importing = [
        path
        for path, source in _sources("tests").items()
        if any(module.split(".")[0] == "benchmarks" for module in _imported_modules(source))
    ]
    assert not importing, f"tests that import a benchmark: {importing}"


def _module_name(path):
    name = path[: -len(".py")].replace(os.sep, ".")
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def _package_of(module):
    """The package a tfdml module belongs to: the module itself for a package, else the one that holds it."""
    return module if os.path.isfile(os.path.join(ROOT, *module.split("."), "__init__.py")) else module.rsplit(".", 1)[0]


def private_imports_across_packages(sources):
    """`(importer, module, name)` of every `from tfdml... import _name` in `sources` ({path: source}) whose
    importer is not inside the package of the module it imports from (a name with a leading underscore is shared
    inside its package only; what another package needs is public)."""
    found = []
    for path, source in sources.items():
        importer = _module_name(path)
        for node in ast.walk(ast.parse(source)):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("tfdml")):
                continue
            package = _package_of(node.module)
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and importer != package and not importer.startswith(package + "."):
                    found.append((importer, node.module, alias.name))
    return found


def test_no_private_name_is_imported_across_packages():
    sources = {}
    for folder in ("tfdml", "tests", "benchmarks", "docs", "scripts", "tools"):
        sources.update(_sources(folder))
    assert not private_imports_across_packages(sources)
    # The rule finds what it forbids, and allows a package's own modules to share a private name.
    planted = {
        os.path.join("tests", "test_x.py"): "from tfdml.pipeline.folder import _exchange\n",
        os.path.join("tfdml", "cli", "x.py"): "from tfdml.config.schema import _convert\n",
        os.path.join("tfdml", "config", "x.py"): "from tfdml.config.schema import _convert, __doc__\n",
    }
    assert private_imports_across_packages(planted) == [
        ("tests.test_x", "tfdml.pipeline.folder", "_exchange"),
        ("tfdml.cli.x", "tfdml.config.schema", "_convert"),
    ]
