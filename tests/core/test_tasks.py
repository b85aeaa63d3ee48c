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
