"""Where bf16 linears run widened to float32: the choice from measured
timings, kept per machine beside the build, and the override."""

from __future__ import annotations

import json

import pytest
from pagoda.kernels import cpu as cpu_kernels
from pagoda.kernels.cpu import bf16_widen_rows, choose_widen_rows, recorded_widen_rows


@pytest.mark.parametrize(
    "timings, rows",
    [
        # Widened wins by more than the margin from 128 rows on.
        ({256: (1.0, 0.95), 512: (2.0, 1.5), 1024: (4.0, 2.8)}, 512),
        ({256: (1.0, 0.8), 512: (2.0, 1.5), 1024: (4.0, 2.8)}, 256),
        # Pairs win (a CPU whose pair dot product is fast): never widen.
        ({256: (1.0, 1.9), 512: (2.0, 3.8), 1024: (4.0, 7.5)}, 0),
        # One count's dip (measured on an Intel Xeon with AVX512-BF16) does
        # not outvote the counts around it.
        ({256: (3.46, 2.38), 512: (7.27, 7.92), 1024: (14.37, 12.17)}, 256),
        # A win at a small count only, not at the larger ones: noise, never.
        ({256: (1.0, 0.5), 512: (2.0, 2.1), 1024: (4.0, 4.2)}, 0),
        # Within the margin: not worth a second code path's rounding.
        ({256: (1.0, 0.97), 512: (2.0, 1.9), 1024: (4.0, 3.7)}, 0),
    ],
)
def test_the_fewest_rows_from_which_widening_wins(timings, rows):
    assert choose_widen_rows(timings) == rows


def test_the_choice_is_measured_once_and_kept(tmp_path):
    record = tmp_path / "bf16_widen_rows.json"
    calls = []

    def measure():
        calls.append(1)
        return {64: (1.0, 0.7), 128: (2.0, 1.4), 256: (4.0, 2.6)}

    assert recorded_widen_rows(record, measure) == 64
    assert json.loads(record.read_text())["widen_from_rows"] == 64
    # Another process (or a restart) reads the record: the same choice
    # whatever a new timing would say.
    assert recorded_widen_rows(record, lambda: {64: (1.0, 2.0)}) == 64
    assert len(calls) == 1
    record.write_text("{not json")  # damaged: measured again
    assert recorded_widen_rows(record, measure) == 64
    assert len(calls) == 2


def test_a_record_that_cannot_be_kept_still_gives_a_choice(tmp_path):
    record = tmp_path / "bf16_widen_rows.json"
    record.mkdir()  # neither readable nor writable as a file, even for root
    assert recorded_widen_rows(record, lambda: {64: (1.0, 0.5)}) == 64


def test_the_environment_overrides_the_measurement(monkeypatch):
    bf16_widen_rows.cache_clear()
    try:
        monkeypatch.setenv(cpu_kernels.WIDEN_ROWS_ENV, "96")
        assert bf16_widen_rows() == 96
        bf16_widen_rows.cache_clear()
        monkeypatch.setenv(cpu_kernels.WIDEN_ROWS_ENV, "0")
        assert bf16_widen_rows() == 0
    finally:
        bf16_widen_rows.cache_clear()


@pytest.mark.parametrize("max_num_seqs", range(1, 65))
def test_no_threshold_falls_between_a_batch_and_its_graph(max_num_seqs):
    # A decode step of b requests replays the graph of the smallest captured
    # size >= b; the two bf16 ways round differently, so both must take the
    # same way, or a replay differs from the eager step.
    from pagoda.runtime.worker.decode_graph import default_capture_sizes

    sizes = default_capture_sizes(max_num_seqs, "cpu")
    for threshold in cpu_kernels.WIDEN_CANDIDATE_ROWS:
        for batch in range(1, max(sizes) + 1):
            graph = min(s for s in sizes if s >= batch)
            assert (batch >= threshold) == (graph >= threshold), (threshold, batch, graph)
