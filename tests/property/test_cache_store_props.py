"""The cache store's invariants under any sequence of operations (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from edge.cache.entry import StoredResponse
from edge.cache.freshness import ResponseFacts
from edge.cache.store import CacheStore

FACTS = ResponseFacts.of(200, [])


def make(key: int, variant: int, size: int, tags: frozenset[str]) -> StoredResponse:
    return StoredResponse(
        key=f"k{key}",
        url=f"https://h/{key}",
        status=200,
        reason=b"OK",
        headers=[],
        body=b"x" * size,
        vary=((b"v", str(variant).encode()),),
        request_time=0.0,
        response_time=0.0,
        initial_age=0.0,
        lifetime=60.0,
        facts=FACTS,
        tags=tags,
    )


operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("put"),
            st.integers(0, 8),
            st.integers(0, 3),
            st.integers(0, 6000),
            st.frozensets(st.sampled_from(["a", "b", "c"]), max_size=2),
        ),
        st.tuples(st.just("touch"), st.integers(0, 8)),
        st.tuples(st.just("purge_tag"), st.sampled_from(["a", "b", "c"])),
        st.tuples(st.just("purge_url"), st.integers(0, 8)),
        st.tuples(st.just("purge_prefix"), st.sampled_from(["https://h/", "https://h/1"])),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(operations, st.integers(0, 40_000), st.integers(1, 3))
def test_the_store_keeps_its_books_and_its_limit(
    ops: list[tuple[object, ...]], max_bytes: int, max_variants: int
) -> None:
    store = CacheStore(max_bytes, max_variants)
    for op in ops:
        if op[0] == "put":
            _, key, variant, size, tags = op
            store.put(make(key, variant, size, tags))  # type: ignore[arg-type]
        elif op[0] == "touch":
            for held in store.variants(f"k{op[1]}"):
                store.touch(held)
        elif op[0] == "purge_tag":
            store.purge_tag(op[1])  # type: ignore[arg-type]
            assert all(op[1] not in e.tags for e in list(store._recency))
        elif op[0] == "purge_url":
            store.purge_url(f"https://h/{op[1]}")
            assert not store.variants(f"k{op[1]}")
        else:
            store.purge_prefix(op[1])  # type: ignore[arg-type]
        held = list(store._recency)
        assert store.bytes_held == sum(e.size for e in held) <= max_bytes
        assert len(held) == sum(len(store.variants(f"k{k}")) for k in range(9))
        for key in range(9):
            variants = store.variants(f"k{key}")
            assert len(variants) <= max_variants
            assert len({v.vary for v in variants}) == len(variants)


def test_the_least_recently_used_entry_goes_first() -> None:
    one = make(1, 0, 1000, frozenset())
    store = CacheStore(3 * one.size, 4)
    entries = [make(k, 0, 1000, frozenset()) for k in range(3)]
    for entry in entries:
        store.put(entry)
    store.touch(entries[0])
    store.put(make(9, 0, 1000, frozenset()))
    assert store.holds(entries[0]) and store.holds(entries[2])
    assert not store.holds(entries[1])
    assert store.evictions == 1


def test_an_entry_larger_than_the_store_is_not_kept() -> None:
    store = CacheStore(1000, 4)
    assert not store.put(make(1, 0, 5000, frozenset()))
    assert len(store) == 0 and store.bytes_held == 0
