"""How the state-growth test judges memory readings: a leak by its total, whatever its shape."""

from __future__ import annotations

from ruvllm.testing.memory_probe import growth_beyond_largest_step

KIB = 1024


def test_a_leak_counts_by_its_total_less_one_lump():
    steady = [i * 200 * KIB for i in range(50)]
    lumpy = [i // 3 * 200 * KIB for i in range(50)]  # every third call: the median step is 0
    assert growth_beyond_largest_step(steady) == 48 * 200 * KIB
    assert growth_beyond_largest_step(lumpy) == 15 * 200 * KIB


def test_a_buffer_held_at_some_calls_only_is_forgiven():
    """mistral.rs's pattern: a 5.65 MiB buffer present at some readings and not at others."""
    buffer = 5786 * KIB
    readings = [buffer if i % 7 in (2, 3) or i == 49 else 0 for i in range(50)]
    assert readings[-1] - readings[0] == buffer
    assert growth_beyond_largest_step(readings) == 0
    assert growth_beyond_largest_step([buffer, 0, buffer, 0]) == -2 * buffer  # as measured: -11.28 MiB
    assert growth_beyond_largest_step([7]) == 0
