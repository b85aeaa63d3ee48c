"""adaptkit.tasks's checks, fed the input each refuses: the error type and what its message names."""
import re

import pytest


def test_task_checks():
    from adaptkit.tasks import bootstrap_ci, first_number_hits, text_task
    with pytest.raises(ValueError, match=re.escape("3 answers for 2 rows")):
        first_number_hits(["1", "2", "3"], [{"answer": "1"}, {"answer": "2"}])
    assert first_number_hits(["1", "x2", "-2"], [{"answer": "1"}, {"answer": "3"}, {"answer": "2"}]) == [True, False,
                                                                                                      False]
    with pytest.raises(ValueError, match="each seed needs a flat, non-empty list of item scores"):
        bootstrap_ci([[[1, 0]], [[0, 1]]])
    with pytest.raises(KeyError, match=re.escape("unknown task 'nope'; choose one of news, chat, puzzle, qa_match")):
        text_task("nope")


@pytest.mark.parametrize("level", [0.95, 0.5])
def test_bootstrap_ci_has_the_width_its_level_calls_for(level):
    "On 1000 normal scores the percentile interval is the normal one: 2 z(level) sd / sqrt(n) wide, about the mean."
    from statistics import NormalDist

    import numpy as np

    from adaptkit.tasks import bootstrap_ci
    scores = np.random.default_rng(1).normal(size=1000)
    se = scores.std() / np.sqrt(scores.size)
    ci = bootstrap_ci(list(scores), level=level)
    want = 2 * NormalDist().inv_cdf((1 + level) / 2) * se  # 3.92 se at 0.95, 1.35 se at 0.5
    assert abs((ci["high"] - ci["low"]) / want - 1) < 0.06, (ci, want)  # 0.9 would be 16% narrower, 0.99 31% wider
    assert ci["level"] == level and ci["low"] < ci["mean"] < ci["high"]
    assert abs((ci["low"] + ci["high"]) / 2 - scores.mean()) < 0.2 * se
