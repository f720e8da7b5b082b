"""A sweep's variants from its --set values (pure), and its budget."""

from __future__ import annotations

import pytest

from orchestrator.errors import InputError
from orchestrator.launch.sweep import budget_env, variants


def test_the_cartesian_product_varies_the_first_key_slowest():
    assert variants(["batching.strategy=sorted,shuffle", "run.lr=1e-4,3e-4"]) == [
        {"batching.strategy": "sorted", "run.lr": "1e-4"}, {"batching.strategy": "sorted", "run.lr": "3e-4"},
        {"batching.strategy": "shuffle", "run.lr": "1e-4"}, {"batching.strategy": "shuffle", "run.lr": "3e-4"}]
    assert variants(["batching.seed=1"]) == [{"batching.seed": "1"}]


@pytest.mark.parametrize("sets, said", [
    ([], "at least one --set"), (["strategy=sorted"], "not section.key"), (["batching.strategy"], "not section.key"),
    (["batching.strategy=a,,b"], "empty value"), (["batching.seed=1,1"], "repeats a value"),
    (["batching.seed=1", "batching.seed=2"], "given twice"),
    ([f"a.k{i}=1,2" for i in range(9)], "more than 256")])
def test_bad_sets_are_refused_with_a_hint(sets, said):
    with pytest.raises(InputError) as err:
        variants(sets)
    assert said in err.value.message and err.value.hint


def test_a_budget_is_steps_or_minutes():
    assert budget_env(200, None) == {"ORCH_MAX_STEPS": "200"}
    assert budget_env(None, 1.5) == {"ORCH_MAX_MINUTES": "1.5"}
    for steps, minutes in ((None, None), (5, 1.0)):
        with pytest.raises(InputError):
            budget_env(steps, minutes)
