"""The radix tree alone: matching, splitting, pinning, LRU eviction, flush."""

from __future__ import annotations

from rvascend.engine.prefix_cache import PrefixCache


def test_match_returns_the_longest_cached_prefix_and_splits_edges():
    cache = PrefixCache(64)
    node, slots = cache.insert([1, 2, 3, 4], [10, 11, 12, 13])
    assert slots == [10, 11, 12, 13] and cache.size == 4
    assert cache.match([1, 2, 3, 4, 5])[0] == [10, 11, 12, 13]
    assert cache.match([9, 1])[0] == []
    got, mid = cache.match([1, 2, 7])
    assert got == [10, 11] and mid.tokens == (1, 2) and mid.children[3] is node
    # A branch off the split point keeps both continuations.
    cache.insert([1, 2, 7, 8], [10, 11, 20, 21])
    assert cache.match([1, 2, 7, 8])[0] == [10, 11, 20, 21]
    assert cache.match([1, 2, 3, 4])[0] == [10, 11, 12, 13]
    assert cache.size == 6


def test_insert_keeps_the_trees_slots_where_the_prefix_was_cached():
    cache = PrefixCache(64)
    cache.insert([1, 2, 3], [10, 11, 12])
    node, slots = cache.insert([1, 2, 3, 4, 5], [30, 31, 32, 33, 34])
    assert slots == [10, 11, 12, 33, 34]
    assert not cache.holds(30) and cache.holds(33) and cache.holds(10)
    assert node.tokens == (4, 5) and cache.size == 5


def test_locked_paths_are_never_evicted_and_lru_goes_first():
    cache = PrefixCache(64)
    old, _ = cache.insert([1, 2], [0, 1])
    pinned, _ = cache.insert([3, 4], [2, 3])
    new, _ = cache.insert([5, 6], [4, 5])
    cache.lock(pinned)
    assert cache.locked_size == 2 and cache.evictable_size == 4
    assert sorted(cache.evict(1)) == [0, 1]  # the oldest unlocked leaf
    cache.match([5, 6])
    assert sorted(cache.evict(100)) == [4, 5]  # everything unlocked, never the pinned path
    assert cache.match([3, 4])[0] == [2, 3] and cache.size == 2
    cache.unlock(pinned)
    assert cache.locked_size == 0 and sorted(cache.evict(100)) == [2, 3] and cache.size == 0


def test_a_lock_pins_every_ancestor_and_survives_splits():
    cache = PrefixCache(64)
    leaf, _ = cache.insert([1, 2, 3, 4], [0, 1, 2, 3])
    cache.lock(leaf)
    cache.match([1, 2, 9])  # splits the locked edge
    cache.insert([1, 2, 9], [0, 1, 7])
    assert cache.locked_size == 4
    assert cache.evict(100) == [7]
    cache.unlock(leaf)
    assert cache.locked_size == 0 and sorted(cache.evict(100)) == [0, 1, 2, 3]


def test_evicting_a_leaf_exposes_its_parent_by_age():
    cache = PrefixCache(64)
    cache.insert([1, 2, 3], [0, 1, 2])
    cache.insert([1, 2, 4], [0, 1, 3])
    cache.insert([7], [4])
    cache.match([1, 2, 3])
    cache.match([7])  # newest
    # [1, 2, 4] is the oldest leaf; then [1, 2, 3]; then its parent [1, 2] (older than [7]).
    assert cache.evict(1) == [3]
    assert cache.evict(1) == [2]
    assert sorted(cache.evict(2)) == [0, 1]
    assert cache.match([7])[0] == [4]


def test_flush_refuses_while_anything_is_locked():
    cache = PrefixCache(64)
    node, _ = cache.insert([1, 2], [5, 6])
    cache.lock(node)
    assert cache.flush() is None and cache.size == 2
    cache.unlock(node)
    assert sorted(cache.flush()) == [5, 6] and cache.size == 0 and cache.match([1, 2])[0] == []
    assert not cache.holds(5)


def test_a_hybrid_tree_resumes_only_where_a_snapshot_is():
    cache = PrefixCache(64, snapshot_slots=[100, 101, 102])
    cache.insert([1, 2, 3, 4, 5, 6], list(range(6)), states={4: cache.take_state()})
    slots, node = cache.match([1, 2, 3, 4, 5, 6, 7])
    assert slots == [0, 1, 2, 3] and node.end == 4 and node.state == 100
    assert cache.match([1, 2, 3, 9])[0] == []  # no snapshot on the way: from the start
    # A split below the snapshot keeps it at its own end, the upper part gets none.
    cache.match([1, 2, 7])
    assert cache.match([1, 2, 3, 4])[1].state == 100 and cache.root.children[1].state is None
    # A second snapshot at the same end goes back to the free ones.
    spare = cache.take_state()
    cache.insert([1, 2, 3, 4], list(range(4)), states={4: spare})
    assert cache.snapshots == 1 and spare in cache.free_states
    try:
        cache.insert([1, 2], [0, 1], states={3: 102})
    except ValueError as e:
        assert "after [3] tokens" in str(e)
    else:
        raise AssertionError("a snapshot past the cached tokens was accepted")


def test_snapshots_are_evicted_least_recently_used_and_shallow_first_but_never_pinned():
    cache = PrefixCache(64, snapshot_slots=[100, 101])
    cache.insert([1, 2, 3, 4], [0, 1, 2, 3], states={2: cache.take_state(), 4: cache.take_state()})
    _, deep = cache.match([1, 2, 3, 4, 5])
    cache.lock(deep)
    cache.pin_state(deep)
    slot = cache.take_state()  # the shallower of the two, used at the same time, goes
    assert slot == 100 and cache.snapshots == 1 and cache.snapshots_evicted == 1
    assert cache.take_state() is None  # the other is pinned by a request yet to read it
    cache.give_state(slot)
    cache.unpin_state(deep)
    cache.unlock(deep)
    assert cache.take_state() == 100 and cache.take_state() == 101 and cache.snapshots == 0
    assert cache.match([1, 2, 3, 4, 5])[0] == []  # K/V without a snapshot: no place to resume


def test_eviction_retirement_and_flush_give_snapshots_back():
    cache = PrefixCache(64, snapshot_slots=[100, 101, 102])
    old, _ = cache.insert([1, 2], [0, 1], states={2: cache.take_state()})
    cache.insert([3, 4], [2, 3], states={2: cache.take_state()})
    cache.match([3, 4])
    assert sorted(cache.evict(2)) == [0, 1] and sorted(cache.free_states) == [100, 102]
    _, node = cache.match([3, 4, 5])
    cache.lock(node)
    cache.pin_state(node)
    assert cache.retire() == [] and cache.snapshots == 1  # pinned: given up by its reader
    cache.unpin_state(node)
    assert sorted(cache.free_states) == [100, 101, 102]
    cache.unlock(node)
    cache.insert([7], [9], states={1: cache.take_state()})
    assert cache.flush() == [9] and sorted(cache.free_states) == [100, 101, 102] and cache.snapshots == 0
