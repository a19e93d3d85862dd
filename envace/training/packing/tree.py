"""`tree` packing: the rows of a step merged into prefix trees, every shared token forwarded once.

All G rollouts of a turn start from one prompt, an episode's caller rows extend each other, and a
task's rehearsals share their instruction, tools and examples: as a trie over every row's prompt +
completion, each distinct prefix is one node. The trie is cut into *segments* (radix edges: runs of
nodes with one child each), and the segments are forwarded in packs:

* inside a pack, a node attends to its ancestors and itself only (tree-shaped attention,
  `envace.training.forward`), at position id = its depth, so its hidden state is the one the row's
  own forward pass would give;
* a subtree that does not fit the token budget is split below its top segment: that segment is
  forwarded alone and *deferred* (its keys and values kept; its activations are recomputed in its
  backward pass), each child subtree is trained attending to the deferred keys and values (detached
  leaves that collect their gradient), and the segment's backward runs last with those gradients
  (`Restore`): every shared token's gradient is the sum over the rows below it, exactly, and only
  deferred segments are forwarded twice. Only the path from the root to the current pack is alive,
  so memory is bounded by the budget, never by the tree.

Under FSDP every process must issue its per-layer collectives in the same order, which deferred
backward passes would not, so `recompute = True` copies the path into each pack instead (computed
again, never deferred): still exact, with less sharing.

The predicted token k of a row is scored in the pack holding the node that predicts it (its parent).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from envace.errors import UsageError
from envace.training.packing.chain import chains
from envace.training.packing.pack import Pack


class BudgetError(UsageError):
    """A row longer than the token budget: no pack can hold it."""


@dataclass(frozen=True)
class SegmentKeys:
    """One segment of a pack: its queries are pack tokens [start, end); its keys are `keys`, ranges over the
    pack's key axis (the external segments' tokens first, then the pack's own); the last range is its own tokens
    (causal), every earlier one is an ancestor (fully visible)."""

    start: int
    end: int
    keys: tuple[tuple[int, int], ...]

    @property
    def ancestors(self) -> int:
        return sum(hi - lo for lo, hi in self.keys[:-1])


@dataclass(frozen=True)
class TreeLayout:
    """A pack's tree-shaped attention: its segments, the deferred segments whose keys and values come first on
    the key axis, the segment whose keys and values are recorded for its children (a deferred pack), and the
    pack's *blocks*: token ranges no other range attends to (the separate trees of a pack with nothing deferred
    above it; the whole pack otherwise), each attended on its own."""

    segments: tuple[SegmentKeys, ...]
    external: tuple[int, ...] = ()
    record: int | None = None
    blocks: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Restore:
    """Run the deferred segment's backward pass, with the gradient its children sent to its keys and values."""

    segment: int


@dataclass
class _Trie:
    ids: list[int]
    depth: list[int]
    parent: list[int]
    completion_nodes: list[list[int]]  # per row, the nodes of its completion tokens


def _trie(seqs: list[list[int]], completion_lengths: list[int]) -> _Trie:
    """The forest of `seqs` with nodes in DFS preorder: inserted in lexicographic order, each new node is the
    next node of the preorder, and a sequence shares with the trie exactly its longest common prefix with the
    sequence before it."""
    ids: list[int] = []
    depth: list[int] = []
    parent: list[int] = []
    completion: list[list[int]] = [[] for _ in seqs]
    path: list[int] = []
    previous: list[int] = []
    for i in sorted(range(len(seqs)), key=seqs.__getitem__):
        seq = seqs[i]
        common = 0
        limit = min(len(seq), len(previous))
        while common < limit and seq[common] == previous[common]:
            common += 1
        del path[common:]
        for d in range(common, len(seq)):
            ids.append(seq[d])
            depth.append(d)
            parent.append(path[-1] if path else -1)
            path.append(len(ids) - 1)
        completion[i] = path[len(seq) - completion_lengths[i]:]
        previous = seq
    return _Trie(ids, depth, parent, completion)


@dataclass
class _Segments:
    """Radix segments of a trie: contiguous node ranges, each a child of its parent segment's last node."""

    bounds: list[tuple[int, int]]
    parent: list[int]
    children: list[list[int]]
    size: list[int]  # tokens of the segment's whole subtree

    def length(self, s: int) -> int:
        return self.bounds[s][1] - self.bounds[s][0]

    def path(self, s: int) -> list[int]:
        """The segment's ancestors, root first."""
        out = []
        while self.parent[s] >= 0:
            s = self.parent[s]
            out.append(s)
        return out[::-1]


def _segments(trie: _Trie) -> tuple[_Segments, list[int]]:
    n = len(trie.ids)
    kids = [0] * n
    for p in trie.parent:
        if p >= 0:
            kids[p] += 1
    starts = [i for i in range(n) if i == 0 or trie.parent[i] != i - 1 or kids[i - 1] != 1]
    bounds = list(zip(starts, starts[1:] + [n], strict=True))
    of_node = [0] * n
    for s, (a, b) in enumerate(bounds):
        of_node[a:b] = [s] * (b - a)
    parent = [of_node[trie.parent[a]] if trie.parent[a] >= 0 else -1 for a, _ in bounds]
    children: list[list[int]] = [[] for _ in bounds]
    for s, p in enumerate(parent):
        if p >= 0:
            children[p].append(s)
    size = [b - a for a, b in bounds]
    for s in range(len(bounds) - 1, -1, -1):  # children come after their parent in preorder
        if parent[s] >= 0:
            size[parent[s]] += size[s]
    return _Segments(bounds, parent, children, size), of_node


class _Planner:
    """Cuts the segment forest into packs of at most `budget` tokens alive at once (module docstring)."""

    def __init__(self, trie: _Trie, segs: _Segments, of_node: list[int], rows: Sequence[int], budget: int,
                 recompute: bool) -> None:
        self.trie, self.segs, self.budget, self.recompute = trie, segs, budget, recompute
        # Each scored token goes to the segment of the node that predicts it.
        self.scored: list[list[tuple[int, int, int]]] = [[] for _ in segs.bounds]  # (row, token, node)
        for row in rows:
            for t, node in enumerate(trie.completion_nodes[row]):
                self.scored[of_node[trie.parent[node]]].append((row, t, node))
        self.ops: list[Pack | Restore] = []
        self.unscored: set[int] = set()  # recompute: path segments whose scored tokens no pack has taken yet

    def plan(self, siblings: list[int], above: list[int], used: int) -> None:
        """Pack the subtrees `siblings` (children of one segment, or roots), whose ancestors `above` are deferred
        (or, when recomputing, copied into every pack) and take `used` tokens."""
        group: list[int] = []
        room, tokens = self.budget - used, 0
        for s in siblings:
            if self.segs.size[s] <= room:  # the whole subtree fits: into the current pack, or a new one
                if tokens + self.segs.size[s] > room:
                    self._flush(group, above)
                    group, tokens = [], 0
                group.append(s)
                tokens += self.segs.size[s]
                continue
            if used + self.segs.length(s) > self.budget:  # cannot happen with budget >= the longest row
                raise BudgetError(f"a row of over {self.budget} tokens does not fit the token budget "
                                  f"packing.max_tokens = {self.budget}")
            if self.recompute:
                self.unscored.add(s)
            else:
                self.ops.append(self._pack([s], above, record=s))
            self.plan(self.segs.children[s], above + [s], used + self.segs.length(s))
            if not self.recompute:
                self.ops.append(Restore(s))
        self._flush(group, above)

    def _flush(self, group: list[int], above: list[int]) -> None:
        if group:
            self.ops.append(self._pack(group, above))

    def _subtree(self, s: int) -> list[int]:
        out, stack = [], [s]
        while stack:
            top = stack.pop()
            out.append(top)
            stack.extend(reversed(self.segs.children[top]))
        return out

    def _pack(self, tops: list[int], above: list[int], record: int | None = None) -> Pack:
        """The pack of the subtrees `tops` (of segment `record` alone, when it is deferred) below `above`."""
        inside = [s for top in tops for s in ([top] if record is not None else self._subtree(top))]
        if self.recompute:  # the path is forwarded again; its scored tokens go to the first pack that holds it
            scored = {s for s in above if s in self.unscored} | set(inside)
            self.unscored -= scored
            external, inside = [], list(above) + inside
        else:
            external, scored = list(above), set(inside)
        ids, positions, local, layout = self._lay_out(inside, external)
        blocks = [(0, len(ids))]
        if not external and not (self.recompute and above):  # separate trees: each its own block
            starts = [seg.start for seg, s in zip(layout, inside, strict=True) if self.segs.parent[s] < 0]
            blocks = list(zip(starts, starts[1:] + [len(ids)], strict=True))
        return Pack(ids, positions, *self._entries([s for s in inside if s in scored], local),
                    TreeLayout(tuple(layout), tuple(external), record, tuple(blocks)))

    def _lay_out(self, inside: list[int], external: list[int]):
        """Tokens and depths of the pack's segments in order, each node's index in it, and each segment's keys
        (the external segments take the first places on the key axis)."""
        key_at: dict[int, tuple[int, int]] = {}
        offset = 0
        for s in external + inside:
            key_at[s] = (offset, offset + self.segs.length(s))
            offset += self.segs.length(s)
        ids: list[int] = []
        positions: list[int] = []
        local: dict[int, int] = {}
        layout = []
        for s in inside:
            a, b = self.segs.bounds[s]
            start = len(ids)
            for node in range(a, b):
                local[node] = len(ids)
                ids.append(self.trie.ids[node])
                positions.append(self.trie.depth[node])
            layout.append(SegmentKeys(start, len(ids), _merged([key_at[p] for p in self.segs.path(s)] + [key_at[s]])))
        return ids, positions, local, layout

    def _entries(self, segments: list[int], local: dict[int, int]):
        """(src, tgt, entry_row, entry_token, entry_node) of the tokens these segments' nodes predict."""
        src, tgt, entry_row, entry_token, entry_node = [], [], [], [], []
        index: dict[int, int] = {}
        for s in segments:
            for row, t, node in self.scored[s]:
                if node not in index:  # a token several rows own is scored once
                    index[node] = len(src)
                    src.append(local[self.trie.parent[node]])
                    tgt.append(self.trie.ids[node])
                entry_row.append(row)
                entry_token.append(t)
                entry_node.append(index[node])
        return src, tgt, entry_row, entry_token, entry_node


def _merged(ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Adjacent key ranges joined, keeping the last (the segment's own, causal) apart."""
    *above, own = ranges
    out: list[tuple[int, int]] = []
    for lo, hi in above:
        if out and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return tuple(out) + (own,)


def tree_packs(rows: Sequence, max_tokens: int | None = None, recompute: bool = False) -> list[Pack | Restore]:
    """The forward passes (and deferred backward passes) of `rows` as prefix trees, in execution order.

    `max_tokens` bounds the tokens alive at once (the current pack and the deferred path above it); unset,
    it is the longest sequence the `chain` strategy would forward, so the tree never holds more than chain's
    longest pass. A row longer than the budget is an error naming both.
    """
    if not rows:
        return []
    seqs = [list(r.prompt_ids) + list(r.completion_ids) for r in rows]
    if max_tokens is None:
        max_tokens = max(len(seqs[g[-1]]) for g in chains(rows))
    check_budget(rows, max_tokens)
    trie = _trie(seqs, [len(r.completion_ids) for r in rows])
    segs, of_node = _segments(trie)
    planner = _Planner(trie, segs, of_node, range(len(rows)), max_tokens, recompute)
    planner.plan([s for s, p in enumerate(segs.parent) if p < 0], [], 0)
    return planner.ops


def check_budget(rows: Sequence, max_tokens: int) -> None:
    """A row longer than the budget fits no pack: one line naming its length and the budget."""
    lengths = [len(r.prompt_ids) + len(r.completion_ids) for r in rows]
    longest = max(range(len(rows)), key=lengths.__getitem__, default=None)
    if longest is not None and lengths[longest] > max_tokens:
        raise BudgetError(f"packing.max_tokens: row {longest} is {lengths[longest]} tokens (prompt + completion), "
                          f"longer than the budget of {max_tokens} tokens a tree pack may hold: raise "
                          "packing.max_tokens")


def tree_tokens(rows: Sequence) -> int:
    """Distinct prefixes of the rows' sequences: the tokens a tree forwards when nothing is recomputed."""
    return len(_trie([list(r.prompt_ids) + list(r.completion_ids) for r in rows], [0] * len(rows)).ids)
