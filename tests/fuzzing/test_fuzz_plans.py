"""Fuzzing (issue 13.7): a real plan with members flipped, truncated, replaced, removed or
added and manifest fields changed, re-checksummed or not, through `wpk run` and
`wpk report`; the CLI contract holds for every one (see tests/fuzzing/harness.py)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzzing.properties import check_plan
from tests.fuzzing.strategies import plan_mutations

CI = settings(max_examples=12, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))


def test_the_unmodified_plan_runs_and_reports(small_plan):
    for command in ("run", "report"):
        outcome = check_plan(small_plan, command)
        assert outcome.violations == [] and outcome.code == 0, outcome.stderr


@CI
@given(st.data())
def test_run_keeps_the_contract_on_damaged_plans(small_plan, data):
    assert check_plan(data.draw(plan_mutations(small_plan)), "run").violations == []


@CI
@given(st.data())
def test_report_keeps_the_contract_on_damaged_plans(small_plan, data):
    assert check_plan(data.draw(plan_mutations(small_plan)), "report").violations == []
