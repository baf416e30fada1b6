"""tests/shards.py: the slow tier's split into shards of similar run time."""

import pytest
import shards
from hypothesis import given
from hypothesis import strategies as st


@given(st.dictionaries(st.text("abc/_.", min_size=1, max_size=8), st.floats(0, 5000), min_size=1, max_size=30),
       st.integers(1, 5))
def test_every_file_lands_in_exactly_one_shard_and_no_shard_is_overfull(seconds, n):
    files = sorted(seconds)
    where = shards.assign(files, n, seconds)
    assert set(where) == set(files) and set(where.values()) <= set(range(1, n + 1))
    assert where == shards.assign(list(reversed(files)), n, seconds)  # the order of collection does not matter
    load = [sum(seconds[f] for f in files if where[f] == i) for i in range(1, n + 1)]
    # Longest-first packing: no shard exceeds the mean by more than its largest file.
    assert max(load) <= sum(load) / n + max(seconds.values()) + 1e-6


def test_unmeasured_files_count_the_default():
    where = shards.assign(["a", "b", "c"], 2, {"a": 10 * shards.DEFAULT_SECONDS})
    assert where["a"] != where["b"] == where["c"]


@pytest.mark.parametrize("text", ["0/3", "4/3", "1", "a/b", "1/0"])
def test_malformed_shards_are_refused(text):
    with pytest.raises(shards.ShardError, match="--shard must be I/N"):
        shards.parse_shard(text)


def test_longest_first_orders_by_measured_time_then_name():
    seconds = {"b": 30.0, "c": 30.0, "a": 5.0}
    assert shards.longest_first(["a", "c", "b", "d", "c"], seconds) == ["d", "b", "c", "a"]  # d: the default 60 s
