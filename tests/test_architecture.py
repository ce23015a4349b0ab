"""The import graph: no cycle between tfdml's modules (the layers contract in setup.cfg, run by
`lint-imports`, forbids upward imports between layers; this also covers cycles inside a layer), and a
configuration error is found before TensorFlow is imported (the CLI answers at once)."""

import subprocess
import sys

import grimp


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
