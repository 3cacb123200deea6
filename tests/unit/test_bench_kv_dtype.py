"""bench/kv_dtype.py's agreement of two greedy runs, token for token."""

import pytest

from bench.kv_dtype import Agreement, Outputs, first_prompt


def _run(ids, finish=None):
    return Outputs("x", ids, finish or ["stop"] * len(ids), 1.0)


def test_agreement_counts_identical_outputs_and_the_tokens_before_the_first_difference():
    reference = _run([[1, 2, 3, 4], [5, 6, 7, 8], [9, 9]])
    other = _run([[1, 2, 3, 4], [5, 6, 0, 8], [9, 9, 9]], ["stop", "stop", "length"])
    a = Agreement.of(reference, other)
    assert a.identical == pytest.approx(1 / 3)
    # 4 + 2 + 2 of the reference's 10 tokens came before a difference (the third only runs longer).
    assert a.prefix_share == pytest.approx(8 / 10)
    assert a.first_difference == [2]  # the third's difference lies past the reference's end
    assert a.same_stop == pytest.approx(2 / 3)
    assert "33.3% identical" in a.describe() and "token 2" in a.describe()


def test_agreement_refuses_runs_of_other_requests():
    with pytest.raises(ValueError, match="same"):
        Agreement.of(_run([[1]]), _run([[1], [2]]))


def test_the_first_prompt_stops_before_the_first_assistant_turn():
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                {"role": "assistant", "content": "a"}, {"role": "user", "content": "u2"}]
    assert first_prompt(messages) == messages[:2]
    assert first_prompt(messages[:2]) == messages[:2]
