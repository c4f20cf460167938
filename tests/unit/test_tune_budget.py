"""``aiocollect.tune``'s budget, with no collector: what ``seconds`` would measure every split,
from the start-ups measured, and how the result says so, in ``tune()``'s words and in the
command's (``aiocollect tune --seconds N``; issue 52, item 6)."""

from __future__ import annotations

import dataclasses

from aiocollect._tune import MIN_WINDOW_S, OUT_OF_TIME, Trial, TuneResult, seconds_for_every_split


def test_the_seconds_for_every_split_add_each_left_splits_start_up_and_a_window():
    # 2 splits of 2 workers measured in 30 s (12 s of start-up each), 4 left: 2 of 1 worker (11 s
    # seen for it) and 2 in this process (no split of 0 workers seen: the most workers', 12 s)
    overhead = {2: 12.0, 1: 11.0}
    left = [(1, 32), (1, 8), (0, 32), (0, 8)]
    assert seconds_for_every_split(30.0, overhead, [0.5, 3.0], left) == 90.0  # 30 + 2 x 14 + 2 x 15, to 10 s
    assert seconds_for_every_split(30.0, overhead, [], left) == 80.0  # windows of MIN_WINDOW_S: 77
    assert seconds_for_every_split(30.0, {}, [], [(4, 8)]) == 40.0  # nothing seen: a second
    assert MIN_WINDOW_S == 0.5


def _result(**kwargs) -> TuneResult:
    trials = (Trial(2, 8, 1600, 50_000.0, 12.2, 3.0, 150_000), Trial(2, 32, 6400, 60_000.0, 12.9, 2.5, 150_000))
    skipped = tuple((w, e, OUT_OF_TIME) for w, e in [(0, 8), (0, 32), (1, 8), (1, 32)])
    return TuneResult("CartPole-v1", "random actions", 2, trials, skipped, trials[1], "MultiSyncCollector(...)",
                      None, **kwargs)


def test_the_result_says_how_many_splits_were_left_and_what_measures_them_all():
    text = str(_result(seconds=30.0, seconds_to_measure_all=90.0))
    assert ("4 of 6 splits not measured: the seconds=30 given were spent (start-ups here took 12-13 s a split); "
            "seconds=90 would measure every split") in text
    assert text.count("skipped: out of time: the time given ran out before it started") == 4


def test_the_command_names_its_flag_not_the_keyword():
    text = str(dataclasses.replace(_result(seconds=30.0, seconds_to_measure_all=90.0), seconds_flag="--seconds "))
    assert "the --seconds 30 given were spent" in text and "--seconds 90 would measure every split" in text
    assert "seconds=" not in text


def test_no_budget_line_where_every_split_was_measured():
    result = _result(seconds=30.0)
    assert result.budget_line() is None and "would measure" not in str(result)
