"""The planner: the fastest verified candidate for every distinct workload.

Graph nodes with equal workloads are measured once. Candidates come from a
list of providers `(workload, target) -> list[Candidate]`; the registry is
the first, and search (generated kernels) adds its own with
`add_candidate_provider` or by passing `providers=` to `plan`. Every
measurement is kept for the report.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from wpk.core.errors import UnsupportedError, WpkError
from wpk.core.workload import Workload
from wpk.kernels.registry import FALLBACK, Candidate
from wpk.search.measure import Measurement, measure_candidate

CandidateProvider = Callable[[Workload, str], Sequence[Candidate]]
ProgressCallback = Callable[[int, int, str], None]
MeasureFn = Callable[..., Measurement]


class NodeWorkloadLike(Protocol):
    """What `wpk.workloads.extract_workloads` yields: a graph node and its workload."""

    node: Any
    workload: Workload


def registry_candidates(workload: Workload, target: str) -> list[Candidate]:
    """Every registered implementation (and config) that supports the workload."""
    from wpk.kernels import registry

    return registry.candidates(workload, target)


CANDIDATE_PROVIDERS: list[CandidateProvider] = [registry_candidates]


def add_candidate_provider(provider: CandidateProvider) -> None:
    """Let `provider` contribute candidates to every later `plan` call (once)."""
    if provider not in CANDIDATE_PROVIDERS:
        CANDIDATE_PROVIDERS.append(provider)


@dataclass(frozen=True)
class PlanOptions:
    """How candidates are measured and chosen."""

    warmup: int = 2
    repeats: int = 5
    max_repeats: int = 50
    min_time: float = 0.05
    seed: int = 0
    strict: bool = False
    tolerance: float | None = None
    timeout: float | None = None
    # What a step saves when it runs inside a merged onnxruntime region rather than in a
    # call of its own (about one session call); see `fastest`.
    region_credit_s: float = 20e-6


@dataclass
class Choice:
    """The chosen candidate of one workload, with every measurement made for it."""

    workload: Workload
    node_names: list[str]
    node_ops: list[str]
    candidate: Candidate
    measurement: Measurement
    measurements: list[Measurement] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.node_names)

    @property
    def is_fallback(self) -> bool:
        return self.candidate.implementation.kind == FALLBACK


@dataclass
class PlanChoices:
    """Choices by workload key, in the order the workloads first appear in the graph."""

    choices: dict[str, Choice]

    def __getitem__(self, key: str) -> Choice:
        return self.choices[key]

    def __iter__(self):
        return iter(self.choices.values())

    def __len__(self) -> int:
        return len(self.choices)


def fastest(verified: Sequence[tuple[Candidate, Measurement]], region_credit_s: float
            ) -> tuple[Candidate, Measurement]:
    """The fastest verified candidate, except that one whose implementation joins the
    runtime's merged regions is preferred when it is at most `region_credit_s` slower:
    inside a region it saves about that much per call, and it does not split the
    region (a blocked Concat between two NCHWc convolutions, say)."""
    best = min(verified, key=lambda pair: pair[1].median_s)
    joining = [pair for pair in verified if pair[0].implementation.joins_regions]
    if joining and not best[0].implementation.joins_regions:
        alternative = min(joining, key=lambda pair: pair[1].median_s)
        if alternative[1].median_s <= best[1].median_s + region_credit_s:
            return alternative
    return best


def _node_name(node: Any) -> str:
    return getattr(node, "name", str(node))


def _unsupported_nodes(groups: dict[str, list[NodeWorkloadLike]], target: str,
                       providers: Sequence[CandidateProvider]) -> list[str]:
    """'name (op: why)' for every node whose workload wpk does not implement itself."""
    try:
        from wpk.kernels.support import unsupported_reason
    except ImportError:  # without the support table: a non-fallback candidate is support
        def unsupported_reason(workload):
            native = any(c.implementation.kind != FALLBACK
                         for p in providers for c in p(workload, target))
            return None if native else "only a fallback implements it"
    missing = []
    for items in groups.values():
        reason = unsupported_reason(items[0].workload)
        if reason is not None:
            missing += [f"{_node_name(i.node)} ({i.workload.op}: {reason})" for i in items]
    return missing


def _gather(workload: Workload, target: str,
            providers: Sequence[CandidateProvider]) -> list[Candidate]:
    found: dict[str, Candidate] = {}
    for provider in providers:
        for candidate in provider(workload, target):
            found.setdefault(candidate.label, candidate)
    return list(found.values())


def _rng_for(seed: int, key: str) -> np.random.Generator:
    return np.random.default_rng([seed, int(key, 16) % (1 << 63)])


def _nodes_text(items: Sequence[NodeWorkloadLike]) -> str:
    names = [_node_name(i.node) for i in items]
    shown = ", ".join(repr(n) for n in names[:5])
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def plan(graph_workloads: Sequence[NodeWorkloadLike], target: str = "cpu",
         options: PlanOptions | None = None, on_progress: ProgressCallback | None = None, *,
         providers: Sequence[CandidateProvider] | None = None,
         measure: MeasureFn | None = None,
         measure_many: Callable[..., list[Measurement]] | None = None) -> PlanChoices:
    """Measure every candidate of every distinct workload and keep the fastest verified one.

    `measure(workload, candidate, rng=..., warmup=..., ...)` measures one candidate;
    `measure_many(workload, candidates, rng=..., warmup=..., ...)`, when given, measures
    all candidates of a workload at once (e.g. concurrently on GPU streams) and returns
    one measurement per candidate, in order; a measurement marked
    `extra["contended"]` ranks but is chosen only when nothing timed alone verified.

    `on_progress(done, total, label)` is called before each workload and once
    at the end. With `options.strict`, any workload that wpk does not support
    natively (it would need a fallback) fails the build before measuring,
    naming every such node. Raises UnsupportedError when no candidate exists
    and WpkError when none verifies, naming the nodes.
    """
    options = options or PlanOptions()
    providers = list(CANDIDATE_PROVIDERS if providers is None else providers)
    measure = measure or measure_candidate
    groups: dict[str, list[NodeWorkloadLike]] = {}
    for item in graph_workloads:
        groups.setdefault(item.workload.key, []).append(item)

    if options.strict:
        missing = _unsupported_nodes(groups, target, providers)
        if missing:
            raise UnsupportedError(
                f"--strict: {len(missing)} node(s) have no native wpk implementation on "
                f"{target}: {', '.join(missing)}",
                hint="drop --strict to run these nodes with the onnxruntime fallback")

    timing = dict(warmup=options.warmup, repeats=options.repeats,
                  max_repeats=options.max_repeats, min_time=options.min_time,
                  tolerance=options.tolerance, timeout=options.timeout)
    run = functools.partial(measure, **timing)
    choices: dict[str, Choice] = {}
    no_candidate, none_verified = [], []
    for done, (key, items) in enumerate(groups.items()):
        workload = items[0].workload
        if on_progress:
            on_progress(done, len(groups), workload.label)
        candidates = _gather(workload, target, providers)
        if not candidates:
            no_candidate.append(f"{workload.op} at {_nodes_text(items)}")
            continue
        rng = _rng_for(options.seed, key)
        if measure_many is not None:
            measured = list(zip(candidates, measure_many(workload, candidates, rng=rng,
                                                         **timing)))
        else:
            measured = [(c, run(workload, c, rng=rng)) for c in candidates]
        verified = [(c, m) for c, m in measured if m.ok]
        if not verified:
            reasons = "; ".join(f"{m.label}: {m.status.value} ({m.message})"
                                for _, m in measured)
            none_verified.append(f"{workload.op} at {_nodes_text(items)} [{reasons}]")
            continue
        # Times taken concurrently with other candidates rank, they do not decide.
        alone = [(c, m) for c, m in verified if not m.extra.get("contended")]
        best, best_measurement = fastest(alone or verified, options.region_credit_s)
        choices[key] = Choice(workload, [_node_name(i.node) for i in items],
                              [getattr(i.node, "op", workload.op) for i in items],
                              best, best_measurement, [m for _, m in measured])
    if on_progress:
        on_progress(len(groups), len(groups), "done")
    if no_candidate:
        raise UnsupportedError(f"no implementation on {target} supports: "
                               + "; ".join(no_candidate),
                               hint="this operator/shape is not supported yet; "
                                    "check `wpk inspect` for the workloads of the model")
    if none_verified:
        raise WpkError("no candidate computed the right answer for: " + "; ".join(none_verified),
                       hint="this is a bug in wpk's kernels; please report it with the model")
    if options.strict:
        fallbacks = [f"{name} ({choice.workload.op}: only the fallback verified)"
                     for choice in choices.values() if choice.is_fallback
                     for name in choice.node_names]
        if fallbacks:
            raise UnsupportedError(f"--strict: {len(fallbacks)} node(s) would run on the "
                                   f"fallback: {', '.join(fallbacks)}",
                                   hint="drop --strict to accept the onnxruntime fallback")
    return PlanChoices(choices)
