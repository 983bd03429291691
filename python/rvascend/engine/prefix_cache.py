"""The prefix cache: a radix tree from token prefixes to the KV pool slots that hold them.

SGLang's radix cache, for a pool of single-token slots: a request whose prompt
starts with tokens some earlier request already ran (a system prompt, the turns
of a chat) takes those tokens' slots instead of recomputing them. K/V of a
token depends only on the tokens before it and its position, both fixed by the
prefix, so the reuse is exact.

Each edge holds a run of tokens and their slots. A running request locks the
deepest node it uses, which pins the whole path to the root; unlocked nodes are
evicted leaf first, least recently used first, when the pool runs out of free
slots. The tree owns every slot it holds: a request gives the slots of its
tokens to the tree when it inserts them and must not free them itself.

When the model's weights change, every cached K/V is stale: `retire` empties
the tree at once. Nodes a running request still pins leave the tree (no new
request matches them) and free their slots when their last lock goes.

A hybrid model (Qwen3.5) needs more than K/V to resume after a prefix: the
linear-attention layers' recurrent states at that token (SGLang's Mamba radix
cache, llama.cpp's context checkpoints). Such a tree is made with snapshot slots
(recurrent-state pool slots of its own) and a node may hold one: the states
after its last token. A match then ends at the deepest node holding a snapshot
(or at the root: a prompt with no cached prefix starts from zeros). Snapshots
are few (a Qwen3.5-0.8B one is 18.6 MiB in BF16), so they are evicted on their own,
least recently used first (the shallower first among equals: a deeper snapshot
of the same path serves more), while the K/V stay; a node's snapshot goes with
it when the node goes. A snapshot some admitted request is about to read is
pinned (`pin_state`) until its first step has read it.
"""

from __future__ import annotations

import itertools
from typing import Optional

_clock = itertools.count()


class Node:
    __slots__ = ("tokens", "slots", "children", "parent", "locks", "last_use", "retired", "end", "state",
                 "state_pins")

    def __init__(self, tokens: tuple[int, ...], slots: list[int], parent: Optional["Node"]) -> None:
        self.tokens = tokens
        self.slots = slots
        self.children: dict[int, Node] = {}
        self.parent = parent
        self.locks = 0
        self.last_use = next(_clock)
        self.retired = False
        self.end = (parent.end if parent is not None else 0) + len(tokens)  # prefix length at its last token
        self.state: Optional[int] = None  # hybrid models: the snapshot slot of the states after its last token
        self.state_pins = 0               # admitted requests yet to read that snapshot


class PrefixCache:
    def __init__(self, pool_slots: int, snapshot_slots: Optional[list[int]] = None) -> None:
        """`snapshot_slots`: a hybrid model's recurrent-state pool slots the tree may keep
        snapshots in (None: a dense model, every node is a place to resume)."""
        self.root = Node((), [], None)
        self.root.locks = 1  # never evicted
        self.hybrid = snapshot_slots is not None
        self.free_states = list(reversed(snapshot_slots or []))
        self.state_slots = len(snapshot_slots or [])
        self._snapshots: set[Node] = set()  # the nodes holding one
        self.snapshots_taken = 0   # snapshots given to the tree (since start)
        self.snapshots_evicted = 0
        self._held = bytearray(pool_slots)  # 1: the slot belongs to the tree
        self.size = 0            # slots held by the tree
        self.locked_size = 0     # of which pinned by running requests
        self.hit_tokens = 0      # prompt tokens served from the cache (since start)
        self.queried_tokens = 0  # prompt tokens looked up
        self.retirements = 0     # times the whole tree was retired (the weights changed)

    # -- lookup --------------------------------------------------------------
    def match(self, tokens: list[int]) -> tuple[list[int], Node]:
        """The slots of the longest cached prefix of `tokens` a request can resume after,
        and the node where it ends (an edge matched part-way is split so that a node ends
        exactly there). A hybrid model's prefix ends at the deepest snapshot on the path."""
        node, _, slots = self._descend(tokens)
        if self.hybrid:
            while node is not self.root and node.state is None:
                node = node.parent
            del slots[node.end:]
        return slots, node

    def holds(self, slot: int) -> bool:
        return bool(self._held[slot])

    # -- pinning -------------------------------------------------------------
    def lock(self, node: Node) -> None:
        while node is not self.root:
            if node.locks == 0:
                self.locked_size += len(node.slots)
            node.locks += 1
            node = node.parent

    def unlock(self, node: Node) -> None:
        """Drops one pin of the path to `node`. Retired nodes nobody pins any more give
        their slots up: they are the unlocking request's own prefix, which it frees
        with the rest of its slots (those the tree no longer holds)."""
        while node is not self.root:
            node.locks -= 1
            if node.locks == 0:
                self.locked_size -= len(node.slots)
                if node.retired:
                    self._release_slots(node)
            node = node.parent

    # -- growth and eviction ---------------------------------------------------
    def insert(self, tokens: list[int], slots: list[int],
               states: Optional[dict[int, int]] = None) -> tuple[Node, list[int]]:
        """Adds `tokens` (whose K/V are in `slots`); returns the node where they end and
        the tree's slots for them. Where a prefix was cached already the tree keeps its
        own slots (the caller's copies there are the caller's to free); the new
        suffix's slots become the tree's. `states` (hybrid models): prefix length ->
        snapshot slot of the states after that many tokens; each becomes the tree's
        (one where the tree has a snapshot already goes back to the free snapshots)."""
        if len(tokens) != len(slots):  # checked before the tree changes: a refusal leaves it whole
            raise ValueError(f"{len(tokens)} tokens cannot be cached with {len(slots)} K/V slots")
        if states and not all(0 < n <= len(tokens) for n in states):
            raise ValueError(f"a snapshot after {sorted(states)} tokens is outside the {len(tokens)} cached")
        node, i, path = self._descend(tokens)
        if i < len(tokens):
            child = Node(tuple(tokens[i:]), list(slots[i:]), node)
            node.children[tokens[i]] = child
            for s in child.slots:
                self._held[s] = 1
            self.size += len(child.slots)
            node, path = child, path + child.slots
        for n, state in sorted((states or {}).items()):
            self._attach_state(self._descend(tokens[:n])[0], state)
        return node, path

    @property
    def evictable_size(self) -> int:
        return self.size - self.locked_size

    def evict(self, wanted: int) -> list[int]:
        """Frees at least `wanted` slots (fewer if not that many are unlocked), least
        recently used leaves first; returns them."""
        freed: list[int] = []
        leaves = sorted((n for n in self._nodes() if not n.children and n.locks == 0), key=lambda n: n.last_use)
        while leaves and len(freed) < wanted:
            leaf = leaves.pop(0)
            freed.extend(self._remove(leaf))
            parent = leaf.parent
            if parent is not self.root and not parent.children and parent.locks == 0:
                # The parent became a leaf: it goes in by its own age.
                at = next((k for k, n in enumerate(leaves) if n.last_use > parent.last_use), len(leaves))
                leaves.insert(at, parent)
        return freed

    # -- snapshots (hybrid models) -------------------------------------------------------
    def take_state(self) -> Optional[int]:
        """A free snapshot slot, evicting the least recently used snapshot nobody is about
        to read if none is free; None if every one is pinned."""
        if not self.free_states:
            candidates = [n for n in self._snapshots if n.state_pins == 0]
            if not candidates:
                return None
            oldest = min(candidates, key=lambda n: (n.last_use, n.end))
            self._drop_state(oldest)
            self.snapshots_evicted += 1
        return self.free_states.pop()

    def give_state(self, slot: int) -> None:
        """Gives back a snapshot slot taken and not used."""
        self.free_states.append(slot)

    def pin_state(self, node: Node) -> None:
        if node is not self.root:
            node.state_pins += 1

    def unpin_state(self, node: Node) -> None:
        if node is not self.root:
            node.state_pins -= 1
            if node.retired and node.state_pins == 0:
                self._drop_state(node)

    @property
    def snapshots(self) -> int:
        return len(self._snapshots)

    def _attach_state(self, node: Node, state: int) -> None:
        if node.state is not None or node.retired:
            self.free_states.append(state)
            return
        node.state = state
        self._snapshots.add(node)
        self.snapshots_taken += 1

    def _drop_state(self, node: Node) -> None:
        if node.state is not None:
            self.free_states.append(node.state)
            node.state = None
            self._snapshots.discard(node)

    def retire(self) -> list[int]:
        """Empties the tree whatever pins it (the weights changed); returns the
        slots freed now. Pinned nodes are retired: out of the tree, given up by `unlock`."""
        freed: list[int] = []
        for node in self._nodes():
            if node.locks:  # a request pinning a snapshot locks its node too
                node.retired = True
            else:
                freed.extend(self._release_slots(node))
        self.root.children.clear()
        self.retirements += 1
        return freed

    def flush(self) -> Optional[list[int]]:
        """Empties the tree and returns its slots, or None if a running request holds a part."""
        if self.locked_size:  # every node holds slots, so no lock goes uncounted
            return None
        nodes = list(self._nodes())
        freed = [s for n in nodes for s in n.slots]
        for s in freed:
            self._held[s] = 0
        for node in nodes:
            self._drop_state(node)
        self.root.children.clear()
        self.size = 0
        return freed

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    # -- internals --------------------------------------------------------------
    def _descend(self, tokens: list[int]) -> tuple[Node, int, list[int]]:
        """(deepest node on the longest cached prefix of `tokens`, its length, its slots),
        marking the path used now."""
        node, slots, i = self.root, [], 0
        now = next(_clock)
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                break
            n = common_prefix_len(child.tokens, tokens, i)
            if n < len(child.tokens):
                child = self._split(child, n)
            child.last_use = now
            slots.extend(child.slots)
            node, i = child, i + n
        return node, i, slots

    def _split(self, child: Node, n: int) -> Node:
        """Cuts `child`'s edge after n tokens; returns the new upper node."""
        upper = Node(child.tokens[:n], child.slots[:n], child.parent)  # the snapshot stays at the lower end
        upper.locks, upper.last_use, upper.retired = child.locks, child.last_use, child.retired
        upper.children[child.tokens[n]] = child
        child.parent.children[child.tokens[0]] = upper
        child.tokens, child.slots, child.parent = child.tokens[n:], child.slots[n:], upper
        return upper

    def _remove(self, leaf: Node) -> list[int]:
        del leaf.parent.children[leaf.tokens[0]]
        return self._release_slots(leaf)

    def _release_slots(self, node: Node) -> list[int]:
        if node.state_pins == 0:  # a pinned one goes when its reader unpins it
            self._drop_state(node)
        for s in node.slots:
            self._held[s] = 0
        self.size -= len(node.slots)
        return node.slots

    def _nodes(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())


def common_prefix_len(a, b, start: int = 0) -> int:
    """How many leading items of `a` equal `b[start:]`'s."""
    n = 0
    limit = min(len(a), len(b) - start)
    while n < limit and a[n] == b[start + n]:
        n += 1
    return n
