"""Buffer plan: memory is reused, and two live tensors never share bytes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from wpk.plans.buffers import BufferPlan, plan_graph_buffers, tensor_lifetimes, view_roots


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
    views = []   # some one-in one-out steps are views (a Reshape): their output, their input
    for reads, outs in steps:
        if len(reads) == 1 and len(outs) == 1 and draw(st.booleans()):
            sizes[outs[0]] = sizes[reads[0]]
            views.append((outs[0], reads[0]))
    return steps, sizes, outputs, views


@settings(max_examples=150, deadline=None)
@given(random_dags())
def test_no_two_live_tensors_overlap_in_memory(dag):
    """Unless they are views of one another: those are one tensor, alive from the first's
    production to the last read of any."""
    steps, sizes, outputs, views = dag
    own = ["in0", "in1", *outputs]
    plan = plan_graph_buffers(steps, sizes, ["in0", "in1"], outputs, [], views)
    roots = view_roots(views, own, [])
    lives = {}
    for life in tensor_lifetimes(steps, sizes):
        root = roots.get(life.name, life.name)
        seen = lives.get(root, life)
        lives[root] = type(life)(root, life.nbytes, min(seen.first, life.first),
                                 max(seen.last, life.last))
    lives.update({name: None for name in own})  # live throughout
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
            ra, rb = roots.get(a, a), roots.get(b, b)
            if plan.assignment[a] == plan.assignment[b] and ra != rb:
                assert lives[ra] is not None and lives[rb] is not None
                first_a, last_a = lives[ra].first, lives[ra].last
                first_b, last_b = lives[rb].first, lives[rb].last
                assert last_a < first_b or last_b < first_a, (a, b)  # both ends inclusive
    assert plan.arena_bytes <= plan.no_reuse_bytes
    assert BufferPlan.from_json(plan.to_json()) == plan


def test_views_share_their_sources_buffer_for_their_joint_lifetime():
    """x -> a -> v1 = view(a) -> v2 = view(v1); b lives while v2 does, so it gets another
    buffer; a, v1 and v2 are one tensor for the plan."""
    steps = [(["x"], ["a"]), (["a"], ["v1"]), (["v1"], ["v2"]), (["x"], ["b"]),
             (["v2", "b"], ["c"]), (["c"], ["y"])]
    sizes = dict.fromkeys(["x", "a", "v1", "v2", "b", "c", "y"], 400)
    plan = plan_graph_buffers(steps, sizes, ["x"], ["y"], [], views=[("v1", "a"), ("v2", "v1")])
    assert plan.assignment["a"] == plan.assignment["v1"] == plan.assignment["v2"]
    assert plan.assignment["b"] != plan.assignment["a"]


def test_views_of_inputs_and_outputs_use_their_buffers_and_two_of_them_stay_apart():
    steps = [(["x"], ["vx"]), (["vx"], ["a"]), (["a"], ["y"]), (["x"], ["z"])]
    sizes = dict.fromkeys(["x", "vx", "a", "y", "z"], 64)
    plan = plan_graph_buffers(steps, sizes, ["x"], ["y", "z"], [],
                              views=[("vx", "x"), ("y", "a"), ("z", "x")])
    assert plan.assignment["vx"] == plan.assignment["x"]   # a view of the input
    assert plan.assignment["a"] == plan.assignment["y"]    # a source of an output
    assert plan.assignment["z"] != plan.assignment["x"]    # input and output: a copy
    assert view_roots([("z", "x"), ("w", "c")], ["x", "z"], ["c"]) == {}


# Parts: a Concat's inputs placed inside its output (`place_parts`).

def test_the_pieces_of_a_concat_are_written_in_place_at_their_offsets():
    """x -> a, x -> b, concat(a, b) -> c -> y: a at offset 0 and b at 128 of c's buffer,
    which lives from a's production to c's last read."""
    steps = [(["x"], ["a"]), (["x"], ["b"]), (["a", "b"], ["c"]), (["c"], ["y"])]
    sizes = {"x": 64, "a": 128, "b": 192, "c": 320, "y": 64}
    plan = plan_graph_buffers(steps, sizes, ["x"], ["y"], [], parts=[("a", "c", 0),
                                                                     ("b", "c", 128)])
    assert plan.assignment["a"] == plan.assignment["b"] == plan.assignment["c"]
    assert (plan.tensor_offset("a"), plan.tensor_offset("b"), plan.tensor_offset("c")) == \
        (0, 128, 0)
    assert plan.sizes[plan.assignment["c"]] >= 320
    assert BufferPlan.from_json(plan.to_json()) == plan
    assert {t["name"]: t.get("offset", 0) for t in plan.to_json()["tensors"]
            if t["name"] in ("a", "b")} == {"a": 0, "b": 128}
    again = plan_graph_buffers(steps, sizes, ["x"], ["y"], [], parts=[("a", "c", 0),
                                                                      ("b", "c", 128)])
    assert again.to_json() == plan.to_json()   # the same order: plans are reproducible


def test_parts_that_would_break_the_plan_stay_tensors_of_their_own():
    """A graph input, a constant, a piece read twice, an offset off the alignment, and a
    tensor another concat placed already are copied, not placed."""
    steps = [(["x"], ["a"]), (["x"], ["b"]), (["a", "x", "w"], ["c"]), (["b", "b"], ["d"]),
             (["a", "c", "d"], ["e"]), (["e"], ["y"])]
    sizes = {"x": 100, "w": 64, "a": 64, "b": 64, "c": 228, "d": 128, "e": 420, "y": 8}
    parts = [("a", "c", 0), ("x", "c", 64), ("w", "c", 164),      # input; constant off 64
             ("b", "d", 0), ("b", "d", 64),                        # read twice
             ("a", "e", 0), ("c", "e", 64), ("d", "e", 292)]       # a placed already; 292
    plan = plan_graph_buffers(steps, sizes, ["x"], ["y"], ["w"], parts=parts)
    assert plan.assignment["a"] == plan.assignment["c"] == plan.assignment["e"]
    assert plan.tensor_offset("a") == 64 and plan.tensor_offset("c") == 64   # a in c in e
    assert plan.assignment["x"] != plan.assignment["c"] and "w" not in plan.assignment
    assert plan.assignment["b"] != plan.assignment["d"]
    assert plan.assignment["d"] != plan.assignment["e"]   # 292 is off the 64-byte alignment


def test_a_concat_that_is_a_graph_output_takes_its_pieces_into_its_own_buffer():
    steps = [(["x"], ["a"]), (["x"], ["v"]), (["v"], ["b"]), (["a", "b"], ["y"])]
    sizes = {"x": 64, "a": 64, "v": 128, "b": 128, "y": 192}
    plan = plan_graph_buffers(steps, sizes, ["x"], ["y"], [], views=[("b", "v")],
                              parts=[("a", "y", 0), ("b", "y", 64)])
    home = plan.assignment["y"]
    assert plan.assignment["a"] == plan.assignment["b"] == plan.assignment["v"] == home
    assert (plan.tensor_offset("b"), plan.tensor_offset("v")) == (64, 64)  # b's view tree
    assert plan.sizes[home] == 192


def test_a_split_tensor_whose_halves_are_pieces_goes_into_the_concat():
    """YOLO's C2f: y = conv(x), its halves a and b slices of it (views at their offsets), c
    computed from b, concat(a, b, c): y itself lies in the concat's buffer at offset 0, so
    neither the slices nor the concat copy a byte."""
    steps = [(["x"], ["y"]), (["y"], ["a"]), (["y"], ["b"]), (["b"], ["c"]),
             (["a", "b", "c"], ["cat"]), (["cat"], ["out"])]
    sizes = {"x": 64, "y": 256, "a": 128, "b": 128, "c": 128, "cat": 384, "out": 64}
    plan = plan_graph_buffers(steps, sizes, ["x"], ["out"], [],
                              parts=[("a", "cat", 0), ("b", "cat", 128), ("c", "cat", 256)],
                              slices=[("a", "y", 0), ("b", "y", 128)])
    assert len({plan.assignment[n] for n in ("y", "a", "b", "c", "cat")}) == 1
    assert [plan.tensor_offset(n) for n in ("y", "a", "b", "c", "cat")] == [0, 0, 128, 256, 0]
    assert plan.sizes[plan.assignment["cat"]] == 384


def test_a_tree_moves_into_a_concat_only_where_it_fits_its_pieces():
    """y's halves are pieces of a concat but y is larger than them (its third part read
    later, after z is written next to the concat in an outer one): y stays apart; swapped
    halves, an unaligned slice and a graph-output source stay apart too; a concat of the
    previous concat's pieces and one more (DenseNet) takes the previous concat in."""
    steps = [(["x"], ["y"]), (["y"], ["a"]), (["y"], ["b"]), (["y"], ["t"]),
             (["a", "b"], ["cat1"]), (["x"], ["z"]), (["cat1", "z"], ["cat2"]),
             (["cat2", "t"], ["out"])]
    sizes = {"x": 64, "y": 384, "a": 128, "b": 128, "t": 128, "cat1": 256, "z": 128,
             "cat2": 384, "out": 64}
    plan = plan_graph_buffers(steps, sizes, ["x"], ["out"], [],
                              parts=[("a", "cat1", 0), ("b", "cat1", 128), ("cat1", "cat2", 0),
                                     ("z", "cat2", 256)],
                              slices=[("a", "y", 0), ("b", "y", 128), ("t", "y", 256)])
    assert plan.assignment["y"] != plan.assignment["cat2"]
    assert plan.assignment["t"] == plan.assignment["y"] and plan.tensor_offset("t") == 256

    steps = [(["x"], ["y"]), (["y"], ["a"]), (["y"], ["b"]), (["b", "a"], ["cat"]),
             (["cat"], ["out"])]
    sizes = {"x": 64, "y": 256, "a": 128, "b": 128, "cat": 256, "out": 64}
    swapped = plan_graph_buffers(steps, sizes, ["x"], ["out"], [],
                                 parts=[("b", "cat", 0), ("a", "cat", 128)],
                                 slices=[("a", "y", 0), ("b", "y", 128)])
    assert swapped.assignment["y"] != swapped.assignment["cat"]
    unaligned = plan_graph_buffers(steps, sizes, ["x"], ["out"], [],
                                   slices=[("a", "y", 0), ("b", "y", 100)])
    assert unaligned.assignment["b"] != unaligned.assignment["y"]
    assert unaligned.assignment["a"] == unaligned.assignment["y"]
    output = plan_graph_buffers(steps, sizes, ["x"], ["out", "y"], [],
                                parts=[("b", "cat", 0), ("a", "cat", 128)],
                                slices=[("a", "y", 0), ("b", "y", 128)])
    assert output.assignment["a"] == output.assignment["y"] != output.assignment["cat"]

    steps = [(["x"], ["x0"]), (["x"], ["x1"]), (["x0", "x1"], ["c1"]), (["c1"], ["x2"]),
             (["x0", "x1", "x2"], ["c2"]), (["c2"], ["out"])]
    sizes = {"x": 64, "x0": 64, "x1": 64, "c1": 128, "x2": 64, "c2": 192, "out": 64}
    dense = plan_graph_buffers(steps, sizes, ["x"], ["out"], [],
                               parts=[("x0", "c1", 0), ("x1", "c1", 64), ("x0", "c2", 0),
                                      ("x1", "c2", 64), ("x2", "c2", 128)])
    assert len({dense.assignment[n] for n in ("x0", "x1", "c1", "x2", "c2")}) == 1
    assert [dense.tensor_offset(n) for n in ("c1", "x1", "x2", "c2")] == [0, 64, 128, 0]


@st.composite
def random_dags_with_parts(draw):
    """Steps that compute, view (one input, same size), slice (a run of one input's bytes,
    at an offset on or off the alignment) or concat (their inputs' bytes side by side, some
    at offsets off the alignment); sizes in bytes."""
    tensors, steps, sizes, views, parts = ["in0"], [], {"in0": 64}, [], []
    kinds, slices = [], {}
    for index in range(draw(st.integers(1, 20))):
        kind = draw(st.sampled_from(["op", "op", "view", "slice", "slice", "concat",
                                     "concat"]))
        out = f"s{index}"
        if kind == "slice":
            reads = [draw(st.sampled_from(tensors))]
            whole = sizes[reads[0]]
            start = draw(st.sampled_from(sorted({0, 64 * (whole // 128), whole // 3})))
            sizes[out] = draw(st.integers(1, whole - start))
            slices[out] = (reads[0], start)
        elif kind == "view":
            reads = [draw(st.sampled_from(tensors))]
            sizes[out] = sizes[reads[0]]
            views.append((out, reads[0]))
        elif kind == "concat":
            reads = draw(st.lists(st.sampled_from(tensors), min_size=1, max_size=4))
            offset = 0
            for name in reads:
                parts.append((name, out, offset))
                offset += sizes[name]
            sizes[out] = offset
        else:
            reads = draw(st.lists(st.sampled_from(tensors), min_size=1, max_size=2))
            sizes[out] = draw(st.sampled_from([8, 64, 100, 128, 192, 256]))
        steps.append((reads, [out]))
        kinds.append(kind)
        tensors.append(out)
    outputs = draw(st.lists(st.sampled_from(tensors[1:]), min_size=1, max_size=2, unique=True))
    return steps, kinds, sizes, outputs, views, parts, slices


@settings(max_examples=300, deadline=None)
@given(random_dags_with_parts())
def test_running_a_plan_with_parts_reads_every_input_intact(dag):
    """Simulate the arena byte by byte: a computing step writes fresh bytes, a view copies
    its input's bytes, a slice a run of them, a concat its inputs' bytes side by side (a
    copy onto the same bytes changes nothing). Every read must find the bytes its producer
    left, the graph outputs too at the end."""
    import numpy as np

    steps, kinds, sizes, outputs, views, parts, slices = dag
    plan = plan_graph_buffers(steps, sizes, ["in0"], outputs, [], views, parts,
                              [(out, src, start) for out, (src, start) in slices.items()])
    arena = np.zeros(plan.arena_bytes, np.int64)
    content: dict[str, np.ndarray] = {}
    fresh = iter(range(1, 1 << 40))

    def where(name):
        start = plan.offsets[plan.assignment[name]] + plan.tensor_offset(name)
        assert start + sizes[name] <= plan.offsets[plan.assignment[name]] + \
            plan.sizes[plan.assignment[name]], name
        return slice(start, start + sizes[name])

    def write(name, values):
        content[name] = values
        arena[where(name)] = values

    write("in0", np.array([next(fresh) for _ in range(sizes["in0"])]))
    for (reads, (out,)), kind in zip(steps, kinds):
        for name in reads:
            assert (arena[where(name)] == content[name]).all(), (name, out)
        if kind == "op":
            write(out, np.array([next(fresh) for _ in range(sizes[out])]))
        elif kind == "slice":
            source, start = slices[out]
            write(out, content[source][start:start + sizes[out]])
        else:
            write(out, np.concatenate([content[name] for name in reads]))
    for name in outputs:
        assert (arena[where(name)] == content[name]).all(), name
