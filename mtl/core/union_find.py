"""Union-find: groups of nodes joined pair by pair, each group's root its smallest node, so that numbering the groups
by their roots follows the nodes' own order. One implementation for every place that joins people: ``mtl data
merge`` (one class per person across datasets, :mod:`mtl.writers.merge`) and the pooling of held-out people (one
person per image two tasks hold out, :mod:`mtl.evaluation.held_out`).
"""


class DisjointSets:
    """Groups of nodes (hashable values that order among themselves, e.g. ints or ``(source, label)`` tuples); a
    node is a group of its own until joined, and is added when first seen."""

    def __init__(self, nodes=()):
        self.parent = {node: node for node in nodes}

    def find(self, node):
        """The root of ``node``'s group (its smallest node), halving the path on the way."""
        parent = self.parent
        parent.setdefault(node, node)
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    def union(self, a, b):
        """Join the groups of ``a`` and ``b``: the smaller of their roots becomes the root of both."""
        root_a, root_b = self.find(a), self.find(b)
        self.parent[max(root_a, root_b)] = min(root_a, root_b)
