"""How a prompt is cut into prefill steps, and which lengths a warm-up must capture."""
from __future__ import annotations

import pytest

from flashrt_ros.engine.graphs import chunk_lengths, prefill_lengths


@pytest.mark.parametrize("n,max_chunk,expected", [
    (0, 16, []), (16, 16, [16]), (37, 16, [16, 16, 4, 1]), (60, 32, [32, 16, 8, 4]),
    (250, 100, [100, 100, 32, 16, 2]),
])
def test_prompt_is_cut_into_full_chunks_then_descending_powers_of_two(n, max_chunk, expected):
    assert chunk_lengths(n, max_chunk) == expected
    assert sum(chunk_lengths(n, max_chunk)) == n


@pytest.mark.parametrize("max_chunk", [1, 16, 100, 256])
def test_prefill_lengths_are_exactly_the_lengths_any_prompt_produces(max_chunk):
    seen = {length for n in range(1, 3 * max_chunk + 1) for length in chunk_lengths(n, max_chunk)}
    assert prefill_lengths(max_chunk) == sorted(seen)
