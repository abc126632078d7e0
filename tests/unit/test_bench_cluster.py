"""The simulation of N hosts in scripts/bench_cluster.py: batches of whole rounds of the
hosts, each trial to the first free host, the best found by a given time."""

import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture(scope="module")
def bench_cluster():
    sys.path.insert(0, str(SCRIPTS))
    try:
        import bench_cluster

        yield bench_cluster
    finally:
        sys.path.remove(str(SCRIPTS))


def test_cluster_replay_keeps_batches_and_fills_the_first_free_host(bench_cluster):
    costs = [(1.0, 5.0), (2.0, 4.0), (1.0, None), (1.0, 3.0), (3.0, 6.0), (1.0, 2.0)]
    one = bench_cluster.replay(costs, 1)
    assert [at for at, _ in one] == [1.0, 3.0, 4.0, 5.0, 8.0, 9.0]   # one host: in order
    two = bench_cluster.replay(costs, 2)   # one batch of 8: greedy on two hosts
    assert [at for at, _ in two] == [1.0, 2.0, 2.0, 3.0, 5.0, 4.0]
    assert bench_cluster.best_by(two, 3.0) == 3.0 and bench_cluster.best_by(two, 0.5) is None
    row = bench_cluster.simulated_row(costs, 2, target=2.0, span=9.0)
    assert row["search_s"] == 5.0 and row["reach_best_s"] == 4.0
    assert row["trials_by_half"] == 5 and row["best_over_time"][-1] == [4.0, 2.0]


def test_cluster_replay_with_nine_trials_on_three_hosts_takes_three_rounds(bench_cluster):
    done = bench_cluster.replay([(1.0, 1.0)] * 9, 3)   # batch_for(3) = 9: one batch
    assert sorted(at for at, _ in done) == [1.0] * 3 + [2.0] * 3 + [3.0] * 3
