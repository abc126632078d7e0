"""The planner: the fastest verified candidate for every distinct workload.

    choices = plan(items, target.candidates, runner, PlanOptions(strict=True))

Graph nodes with equal workloads are measured once. `candidates(workload)`
lists what to measure (a target's candidates, plus what a search found);
`runner.run(workload, candidates)` verifies and times them
(`wpk.search.runner`); `wpk.search.choice.choose` picks the winner, preferring
a step that keeps an onnxruntime region whole when it is at most
`region_credit_s` slower. Every measurement is kept for the report.

A node whose result onnxruntime's own kernel misses the float64 reference on by a
rounding-sized error (a division by a computed value, cancellation: below
`ROUNDING_ERROR_BOUND`, over the default tolerance) cannot be verified within the default
tolerance by any float32 kernel. Its candidates are measured again within twice
onnxruntime's error on the same inputs (`loosened_tolerance`), onnxruntime's node among
them, so the plan computes it no worse than onnxruntime does; the choice records that
tolerance (`Choice.tolerance`, the report's `tolerance`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from wpk.core.errors import ModelError, UnsupportedError, WpkError
from wpk.core.op_checks import op_problem
from wpk.core.workload import Workload
from wpk.kernels import registry
from wpk.kernels.flops import workload_flops
from wpk.kernels.registry import FALLBACK, GENERATED, Candidate
from wpk.kernels.support import unsupported_reason
from wpk.search.choice import Reason, choose, explain
from wpk.search.measure import Measurement, Status, tolerance_for
from wpk.search.runner import INTERLEAVED_ROUNDS, Runner
from wpk.search.workers import MeasureOptions

CandidateSource = Callable[[Workload], Sequence[Candidate]]
ProgressCallback = Callable[[int, int, str], None]


class NodeWorkloadLike(Protocol):
    """What `wpk.workloads.extract_workloads` yields: a graph node and its workload."""

    node: Any
    workload: Workload


@dataclass(frozen=True)
class PlanOptions:
    """How candidates are measured and chosen."""

    warmup: int = 2
    repeats: int = 5
    max_repeats: int = 50
    min_time: float = 0.05
    strict: bool = False
    tolerance: float | None = None
    timeout: float | None = None
    # What a step saves when it runs inside a merged onnxruntime region rather than in a
    # call of its own (about one session call); see `wpk.search.choice`.
    region_credit_s: float = 20e-6
    # Rounds of the close candidates, interleaved (`Runner.run_interleaved`); 1: one each.
    rounds: int = INTERLEAVED_ROUNDS

    def measure_options(self) -> MeasureOptions:
        """The runner options of the planner's measurements."""
        return MeasureOptions(warmup=self.warmup, repeats=self.repeats,
                              max_repeats=self.max_repeats, min_time=self.min_time,
                              tolerance=self.tolerance, run_timeout_s=self.timeout)


@dataclass
class Choice:
    """The chosen candidate of one workload, with every measurement made for it."""

    workload: Workload
    node_names: list[str]
    node_ops: list[str]
    candidate: Candidate
    measurement: Measurement
    measurements: list[Measurement] = field(default_factory=list)
    # Why it won (`reason_entry`: the rule of `wpk.search.choice` that decided); None
    # for a choice made elsewhere.
    reason: dict | None = None
    # The relative L2 tolerance its candidates were verified within, when the default one
    # was loosened to twice onnxruntime's own error (`loosened_tolerance`); else None.
    tolerance: float | None = None

    @property
    def count(self) -> int:
        return len(self.node_names)

    @property
    def is_fallback(self) -> bool:
        return self.candidate.implementation.kind == FALLBACK

    @property
    def algorithm(self) -> str:
        """The chosen implementation's algorithm for the workload ('direct', '1x1', ...)."""
        return self.candidate.implementation.algorithm(self.workload, self.candidate.config)

    @property
    def flops(self) -> int | None:
        """The workload's FLOPs per execution (`wpk.kernels.flops`), None when not counted."""
        return workload_flops(self.workload)


@dataclass
class PlanChoices:
    """Choices by workload key, in the order the workloads first appear in the graph.

    A tuned build's final choices also carry `untuned`: the same measurements' choices
    among the candidates an untuned build offers (`untuned_choices`), for the end-to-end
    check; None elsewhere."""

    choices: dict[str, Choice]
    untuned: PlanChoices | None = None

    def __getitem__(self, key: str) -> Choice:
        return self.choices[key]

    def __iter__(self):
        return iter(self.choices.values())

    def __len__(self) -> int:
        return len(self.choices)


def joins_regions(candidate: Candidate) -> bool:
    """Whether the runtime runs the candidate inside a merged onnxruntime region."""
    return candidate.implementation.joins_regions


def reason_entry(reason: Reason, credit_s: float) -> dict:
    """The JSON form of a `Reason` for the report: the rule, the verified count, the faster
    candidate a region choice passed over (label, seconds slower) and the runner-up's label."""
    entry = {"rule": reason.rule, "verified": reason.verified}
    if reason.faster is not None:
        entry.update(faster=reason.faster[0].label, over_s=reason.over_s, credit_s=credit_s)
    if reason.runner_up is not None:
        entry["runner_up"] = reason.runner_up[0].label
    return entry


def _node_name(node: Any) -> str:
    return getattr(node, "name", str(node))


def _nodes_text(items: Sequence[NodeWorkloadLike]) -> str:
    names = [_node_name(i.node) for i in items]
    shown = ", ".join(repr(n) for n in names[:5])
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _check_op_specs(groups: dict[str, list[NodeWorkloadLike]]) -> None:
    """ModelError for the first workload that violates the ONNX spec of its op."""
    for items in groups.values():
        problem = op_problem(items[0].workload)
        if problem:
            op = items[0].workload.op
            raise ModelError(f"{op} node {_nodes_text(items)}: {problem}",
                             hint=f"fix the model: the ONNX spec of {op} does not allow this "
                                  "(the exporter, or an edit of the model, produced it)")


# The implementation that runs a node as onnxruntime does (`kernels/cpu/ort_node.py`)
PEER_IMPL = "ort"
# onnxruntime's node off the reference by less than this: rounding, not a wrong result
# (Swin's qkv bias divided by the product, which crosses zero, mutated so by the passes'
# fuzzer: onnxruntime's node and wpk's kernels all 1.02e-2 off, the plan matching
# onnxruntime's outputs)
ROUNDING_ERROR_BOUND = 5e-2
# ... and then the candidates are verified within this many times its error (at most
# `ROUNDING_ERROR_BOUND`): no worse than onnxruntime computes the node
PEER_ERROR_FACTOR = 2.0


def peer_rounding_error(measured: Sequence[tuple[Candidate, Measurement]]) -> float | None:
    """onnxruntime's own node's relative L2 error when it, too, failed verification only by
    exceeding the tolerance, by less than `ROUNDING_ERROR_BOUND`: the node's result is that
    sensitive to float32 rounding on random inputs (a division by a computed value,
    cancellation), not wrong in wpk's kernels. None otherwise."""
    return next((m.rel_l2_error for _, m in measured
                 if m.impl == PEER_IMPL and m.status is Status.WRONG_ANSWER
                 and math.isfinite(m.rel_l2_error) and m.rel_l2_error < ROUNDING_ERROR_BOUND),
                None)


def loosened_tolerance(workload: Workload, measured: Sequence[tuple[Candidate, Measurement]],
                       options: MeasureOptions) -> float | None:
    """The tolerance a node's candidates are measured again within when none verified and
    onnxruntime's own node missed the tolerance by a rounding-sized error
    (`peer_rounding_error`): `PEER_ERROR_FACTOR` times that error (two significant digits,
    so records of a rebuild match it), at most `ROUNDING_ERROR_BOUND`; None when that is no
    looser than the tolerance measured within."""
    error = peer_rounding_error(measured)
    if error is None:
        return None
    default = tolerance_for(workload) if options.tolerance is None else options.tolerance
    loosened = float(f"{min(ROUNDING_ERROR_BOUND, PEER_ERROR_FACTOR * error):.2g}")
    return loosened if loosened > default else None


def _raise_none_verified(failed: list[tuple[str, set[Status], bool]]) -> None:
    """Why no candidate verified: wrong answers are wpk's bug, unless onnxruntime's own
    node missed the tolerance too (an ill-conditioned node; even twice its error was not
    met); candidates that all failed to compile or run point first at the node itself."""
    text = "; ".join(entry for entry, _, _ in failed)
    if all(sensitive for _, _, sensitive in failed):
        raise WpkError(
            "no candidate met the float64 reference within the tolerance, nor within "
            f"{PEER_ERROR_FACTOR:g}x onnxruntime's own error, for: " + text +
            " -- onnxruntime's own node missed the tolerance too, so the node's result is "
            "sensitive to float32 rounding on random inputs (a division by a computed "
            "value, cancellation)",
            hint="wpk cannot verify a kernel for such a node; run this model with "
                 "onnxruntime, or compute the sensitive part in float64 in the model")
    if any(Status.WRONG_ANSWER in statuses for _, statuses, _ in failed):
        raise WpkError("no candidate computed the right answer for: " + text,
                       hint="this is a bug in wpk's kernels; please report it with the model")
    raise UnsupportedError("every implementation failed to compile or run: " + text,
                           hint="check the node's attributes and input shapes against the "
                                "ONNX spec of its op (onnxruntime's own check of the model "
                                "may tell more); if the model is valid, report it with the "
                                "model as a bug in wpk")


def _check_strict(groups: dict[str, list[NodeWorkloadLike]]) -> None:
    missing = []
    for items in groups.values():
        reason = unsupported_reason(items[0].workload)
        if reason is not None:
            missing += [f"{_node_name(i.node)} ({i.workload.op}: {reason})" for i in items]
    if missing:
        raise UnsupportedError(
            f"--strict: {len(missing)} node(s) have no native wpk implementation: "
            f"{', '.join(missing)}",
            hint="drop --strict to run these nodes with the onnxruntime fallback")


def _distinct(candidates: Sequence[Candidate]) -> list[Candidate]:
    found: dict[str, Candidate] = {}
    for candidate in candidates:
        found.setdefault(candidate.label, candidate)
    return list(found.values())


def plan(graph_workloads: Sequence[NodeWorkloadLike], candidates: CandidateSource,
         runner: Runner, options: PlanOptions | None = None,
         on_progress: ProgressCallback | None = None) -> PlanChoices:
    """Measure every candidate of every distinct workload and keep the fastest verified one.

    `on_progress(done, total, label)` is called before each workload and once at the
    end. With `options.strict`, any workload that wpk does not support natively (it
    would need a fallback) fails the build before measuring, naming every such node.
    Raises UnsupportedError when no candidate exists and WpkError when none verifies,
    naming the nodes.
    """
    options = options or PlanOptions()
    groups: dict[str, list[NodeWorkloadLike]] = {}
    for item in graph_workloads:
        groups.setdefault(item.workload.key, []).append(item)
    _check_op_specs(groups)
    if options.strict:
        _check_strict(groups)
    listed = {key: _distinct(candidates(items[0].workload)) for key, items in groups.items()}
    for key, found in listed.items():
        runner.prefetch(groups[key][0].workload, _first_round(found)[0])
    choices: dict[str, Choice] = {}
    no_candidate, none_verified = [], []
    for done, (key, items) in enumerate(groups.items()):
        workload = items[0].workload
        if on_progress:
            on_progress(done, len(groups), workload.label)
        if not listed[key]:
            no_candidate.append(f"{workload.op} at {_nodes_text(items)}")
            continue
        measured, winner, loosened = _measure_and_choose(workload, listed[key], runner,
                                                         options)
        if winner is None:
            reasons = "; ".join(f"{m.label}: {m.status.value} ({m.message})"
                                for _, m in measured)
            none_verified.append((f"{workload.op} at {_nodes_text(items)} [{reasons}]",
                                  {m.status for _, m in measured},
                                  peer_rounding_error(measured) is not None))
            continue
        reason = explain(measured, winner, prefer=joins_regions)
        choices[key] = Choice(workload, [_node_name(i.node) for i in items],
                              [getattr(i.node, "op", workload.op) for i in items],
                              winner[0], winner[1], [m for _, m in measured],
                              reason_entry(reason, options.region_credit_s), loosened)
    if on_progress:
        on_progress(len(groups), len(groups), "done")
    if no_candidate:
        raise UnsupportedError("no implementation supports: " + "; ".join(no_candidate),
                               hint="this operator/shape is not supported yet; "
                                    "check `wpk inspect` for the workloads of the model")
    if none_verified:
        _raise_none_verified(none_verified)
    if options.strict:
        fallbacks = [f"{name} ({choice.workload.op}: only the fallback verified)"
                     for choice in choices.values() if choice.is_fallback
                     for name in choice.node_names]
        if fallbacks:
            raise UnsupportedError(f"--strict: {len(fallbacks)} node(s) would run on the "
                                   f"fallback: {', '.join(fallbacks)}",
                                   hint="drop --strict to accept the onnxruntime fallback")
    return PlanChoices(choices)


def _first_round(found: Sequence[Candidate]) -> tuple[list[Candidate], list[Candidate]]:
    """(the candidates measured first, the last resorts measured only when none of those
    verifies: `Implementation.last_resort`)."""
    first = [c for c in found if not c.implementation.last_resort]
    return first, [c for c in found if c.implementation.last_resort]


def _measure_and_choose(workload: Workload, found: Sequence[Candidate], runner: Runner,
                        options: PlanOptions
                        ) -> tuple[list[tuple[Candidate, Measurement]],
                                   tuple[Candidate, Measurement] | None, float | None]:
    """(every measurement, the winner or None, the loosened tolerance or None): when none
    verifies and onnxruntime's node missed the tolerance by rounding, the candidates
    measured again within `loosened_tolerance` (module docstring)."""
    measure_options = options.measure_options()
    measured = _measure(workload, found, runner, measure_options, options.rounds)
    winner = choose(measured, prefer=joins_regions, credit_s=options.region_credit_s)
    loosened = (None if winner is not None
                else loosened_tolerance(workload, measured, measure_options))
    if loosened is not None:
        measured = _measure(workload, found, runner,
                            dataclasses.replace(measure_options, tolerance=loosened),
                            options.rounds)
        winner = choose(measured, prefer=joins_regions, credit_s=options.region_credit_s)
    return measured, winner, loosened


def _measure(workload: Workload, found: Sequence[Candidate], runner: Runner,
             options, rounds: int) -> list[tuple[Candidate, Measurement]]:
    """Every candidate's measurement (the close ones in `rounds` interleaved rounds), the
    last resorts only when no other one verified."""
    first, last = _first_round(found)
    measured = (list(zip(first, runner.run_interleaved(workload, first, options, rounds)))
                if first else [])
    if last and not any(m.ok for _, m in measured):
        measured += zip(last, runner.run(workload, last, options))
    return measured


def _measured_pair(measurement: Measurement) -> tuple[Candidate, Measurement] | None:
    """(candidate, measurement) of a measurement of a registered implementation."""
    try:
        return Candidate(registry.get(measurement.impl), measurement.config), measurement
    except KeyError:
        return None


def within_regions(choices: PlanChoices) -> PlanChoices | None:
    """The choices with every candidate that leaves onnxruntime's regions replaced by the
    fastest verified measured candidate that joins them (reason rule `region`, for the end
    to end check of `wpk.partition`); None when no choice would change.

    Per-operator wins can lose end to end: a generated kernel a little faster than
    onnxruntime's on its own splits a region in two, and the boundary (a session call,
    threads woken again, caches cold) can cost more than it saved."""
    return _given_to(choices, lambda candidate, _: joins_regions(candidate), "region")


def on_generated_kernels(choices: PlanChoices, max_slowdown: float = 3.0) -> PlanChoices | None:
    """The choices with every step that runs in onnxruntime given to the fastest verified
    measured generated kernel (or library kernel with no thread pool of its own: numpy's
    Reshape or Transpose, wpk's blocked reorders, which join the generated kernels'
    native chain) when that is at most
    `max_slowdown` times slower alone (reason rule `one-pool`, for the end-to-end check of
    `wpk.partition`); None when no choice would change.

    The mirror of `within_regions`: a plan that alternates generated kernels (OpenMP
    threads) and onnxruntime's steps (its own threads) hands the cores from one thread pool
    to the other at every boundary, and a pool's sleeping threads are woken again, with cold
    caches, each time. A plan of generated kernels only keeps one pool's threads busy from
    its first step to its last, which can win end to end what it loses per operator:
    ResNet-50's plan with 54 of its 57 convolutions on generated kernels, some 2x slower
    alone than onnxruntime's, ran at 0.81-0.90x onnxruntime's latency where the
    per-operator plan ran at 0.92-0.97x (2-core VM, 2026-11-26)."""
    def one_pool(candidate: Candidate, workload: Workload) -> bool:
        impl = candidate.implementation
        return impl.kind == GENERATED or impl.one_pool

    def in_chain(candidate: Candidate, workload: Workload) -> bool:
        return one_pool(candidate, workload) and candidate.implementation.native_chain(workload)

    pooled = _given_to(choices, one_pool, "one-pool", max_slowdown)
    # a step of the calling thread that has no native form (numpy's elementwise ops)
    # still splits the chain: in ConvNeXt's run each residual Add of 45 us alone took
    # 220-240 us between two native calls (the OpenMP threads spinning beside it)
    chained = _given_to(pooled or choices, in_chain, "one-pool", max_slowdown)
    return chained or pooled


def untuned_choices(choices: PlanChoices, offered: Mapping[str, Collection[str]]
                    ) -> PlanChoices | None:
    """The choices with every candidate an untuned build does not offer (`offered`: the
    candidate labels it does, by workload key) replaced by the fastest verified measured
    one it does (reason rule `untuned`); None when no choice would change.

    A search's configs win their workloads alone, each timed warm and in isolation; in the
    plan they run after one another, where a config that reads more (a Winograd tile's
    larger transformed filter, say) can lose what it won, and a tuned plan can run slower
    than the untuned one (a GA-tuned MobileNet-like plan once ran at 1.47x onnxruntime's
    latency where the untuned one ran at 1.09x). So the end-to-end check measures this
    plan next to the tuned one."""
    return _given_to(choices, lambda candidate, workload: candidate.label in
                     offered.get(workload.key, ()), "untuned")


def runs_in_place(candidate: Candidate, workload: Workload) -> bool:
    """Whether the candidate runs `workload` on tensors the buffer plan may place inside
    one another, so it copies nothing: a Concat whose pieces its producers write into its
    output (`Implementation.places_inputs`), a ChannelSlice whose output stays inside its
    input (`Implementation.slices_input`)."""
    places = getattr(candidate.implementation, "places_inputs", None)
    sliced = getattr(candidate.implementation, "slices_input", None)
    return bool(places and places(workload)) or bool(sliced and
                                                     sliced(workload) is not None)


def in_place_choices(choices: PlanChoices) -> PlanChoices:
    """The choices with every workload that a verified candidate runs in place given to
    that candidate (reason rule `in-place`, `runs_in_place`), `untuned` likewise. Its time
    alone is a copy of every input; in the plan the producers write a concat's inputs into
    its output, a slice stays inside its input, and the copy is skipped
    (`wpk.plans.buffers`); where one cannot be placed it is one memcpy, as another
    engine's Concat or Slice is. CPU plans only (the buffer plan of other targets places
    nothing)."""
    placeable = {key for key, choice in choices.choices.items()
                 if any(pair and pair[1].ok and runs_in_place(pair[0], choice.workload)
                        for pair in map(_measured_pair, choice.measurements))}
    if not placeable:
        return choices
    given = _given_to(choices, lambda candidate, workload: workload.key not in placeable
                      or runs_in_place(candidate, workload), "in-place") or choices
    untuned = None if choices.untuned is None else in_place_choices(choices.untuned)
    return dataclasses.replace(given, untuned=untuned)


def _given_to(choices: PlanChoices, wanted: Callable[[Candidate, Workload], bool], rule: str,
              max_slowdown: float = float("inf")) -> PlanChoices | None:
    """The choices with every candidate that is not `wanted` replaced by the fastest
    verified measured one that is, when that is at most `max_slowdown` times slower (the
    reason says `rule` and what it passed over); None when no choice would change."""
    changed, result = False, {}
    for key, choice in choices.choices.items():
        result[key] = choice
        if wanted(choice.candidate, choice.workload):
            continue
        best = choose([pair for pair in map(_measured_pair, choice.measurements)
                       if pair is not None and wanted(pair[0], choice.workload)])
        if best is None or best[1].median_s > max_slowdown * choice.measurement.median_s:
            continue
        over = best[1].median_s - choice.measurement.median_s
        result[key] = dataclasses.replace(
            choice, candidate=best[0], measurement=best[1],
            reason={"rule": rule, "verified": (choice.reason or {}).get("verified", 1),
                    "faster": choice.candidate.label, "over_s": over, "credit_s": over,
                    "end_to_end": True})
        changed = True
    return PlanChoices(result) if changed else None
