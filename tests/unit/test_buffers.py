"""Buffer plan: memory is reused, and two live tensors never share bytes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from wpk.plans.buffers import BufferPlan, plan_graph_buffers, tensor_lifetimes


def chain(length, size=1000):
    steps = [(["x" if i == 0 else f"t{i - 1}"], [f"t{i}"]) for i in range(length)]
    sizes = {f"t{i}": size for i in range(length)} | {"x": size}
    return steps, sizes


def test_a_chain_needs_two_intermediate_buffers():
    steps, sizes = chain(10)
    plan = plan_graph_buffers(steps, sizes, ["x"], ["t9"], [])
    intermediates = {plan.assignment[f"t{i}"] for i in range(9)}
    assert len(intermediates) == 2
    assert plan.assignment["x"] not in intermediates and plan.assignment["t9"] not in intermediates
    assert plan.arena_bytes == 4 * 1024 and plan.no_reuse_bytes == 11 * 1024


def test_constants_are_not_buffers_and_best_fit_picks_the_smallest_free_buffer():
    steps = [(["x", "w"], ["a"]), (["a"], ["b"]), (["b"], ["c"]), (["a", "c"], ["d"]),
             (["d"], ["y"])]
    sizes = {"x": 8, "w": 8, "a": 4000, "b": 3000, "c": 100, "d": 90, "y": 8}
    plan = plan_graph_buffers(steps, sizes, ["x"], ["y"], ["w"])
    assert "w" not in plan.assignment
    # b dies at step 2, so d (born at step 3) fits in its buffer, not in a's (a lives to 3).
    assert plan.assignment["d"] == plan.assignment["b"]
    assert plan.assignment["c"] not in (plan.assignment["a"], plan.assignment["b"])


def test_unread_outputs_live_during_their_step_only():
    lives = tensor_lifetimes([(["x"], ["a", "unused"]), (["a"], ["y"])],
                             {"a": 4, "unused": 4, "y": 4}, exclude=["x"])
    by_name = {life.name: (life.first, life.last) for life in lives}
    assert by_name == {"a": (0, 1), "unused": (0, 0), "y": (1, 1)}


@st.composite
def random_dags(draw):
    count = draw(st.integers(1, 25))
    tensors, steps, sizes = ["in0", "in1"], [], {"in0": 16, "in1": 16}
    for index in range(count):
        reads = draw(st.lists(st.sampled_from(tensors), min_size=1, max_size=3))
        outs = [f"s{index}_{k}" for k in range(draw(st.integers(1, 2)))]
        for name in outs:
            sizes[name] = draw(st.integers(0, 5000))
        steps.append((reads, outs))
        tensors.extend(outs)
    outputs = draw(st.lists(st.sampled_from(tensors[2:]), min_size=1, max_size=3, unique=True))
    return steps, sizes, outputs


@settings(max_examples=150, deadline=None)
@given(random_dags())
def test_no_two_live_tensors_overlap_in_memory(dag):
    steps, sizes, outputs = dag
    plan = plan_graph_buffers(steps, sizes, ["in0", "in1"], outputs, [])
    lives = {life.name: life for life in tensor_lifetimes(steps, sizes)}
    lives.update({name: None for name in ["in0", "in1", *outputs]})  # live throughout
    for name, size in sizes.items():
        assert size <= plan.sizes[plan.assignment[name]]
    ranges = [(plan.offsets[i], plan.offsets[i] + plan.sizes[i]) for i in range(len(plan.sizes))]
    for i, (start, end) in enumerate(ranges):
        assert start % 64 == 0
        for other_start, other_end in ranges[i + 1:]:
            assert end <= other_start or other_end <= start
    names = sorted(sizes)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if plan.assignment[a] == plan.assignment[b]:
                assert lives[a] is not None and lives[b] is not None
                first_a, last_a = lives[a].first, lives[a].last
                first_b, last_b = lives[b].first, lives[b].last
                assert last_a < first_b or last_b < first_a, (a, b)  # both ends inclusive
    assert plan.arena_bytes <= plan.no_reuse_bytes
    assert BufferPlan.from_json(plan.to_json()) == plan
