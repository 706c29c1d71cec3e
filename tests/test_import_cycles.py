"""No import cycle anywhere in the package (issue 21): a module never reaches itself through what it imports.

import-linter's contracts say who may import whom between layers; this test closes the gap inside a layer
(daemon/shards.py and the reconcile pass used to import each other). grimp builds the same graph lint-imports
reads, TYPE_CHECKING imports included: a cycle there is still a knot for the reader."""

from __future__ import annotations

import grimp


def test_the_package_has_no_import_cycle() -> None:
    graph = grimp.build_graph("reconciler")
    cycles = []
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if imported != module and graph.chain_exists(importer=imported, imported=module):
                chain = graph.find_shortest_chain(importer=imported, imported=module)
                cycles.append(f"{module} -> " + " -> ".join(chain or ()))
    assert not cycles, "import cycles:\n" + "\n".join(cycles)
