"""How a tuning run measures: the options every script and the Python API share, and the cost model and
measurer they make. The defaults below *are* the scripts' settings; the timing ones are
:class:`~ansor.measure.runner.RunConfig`'s."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Optional, Protocol, Sequence

from ..errors import AnsorError
from ..log.measurement import MeasureCallback, MeasureInput, MeasureResult
from ..measure.runner import RunConfig
from ..sketch.policy import SearchParams

if TYPE_CHECKING:
    import tvm


class Measurer(Protocol):
    """What the tuning loop measures with (:class:`~ansor.measure.measurer.ProgramMeasurer`, or the caller's)."""

    def measure(self, inputs: Sequence[MeasureInput]) -> list[MeasureResult]: ...


@dataclass(frozen=True)
class RunnerOptions:
    """How each built candidate is checked and timed (arguments of the Ray runner).

    The timing fields and their defaults are :class:`~ansor.measure.runner.RunConfig`'s, which says why
    (3 repeats of ~15 ms, each run after a cache flush on a CPU, far-slower candidates timed by one run).
    ``timeout``: seconds per run before its runner is killed (``None``: the measurer's
    ``DEFAULT_RUN_TIMEOUT``); ``None`` for ``slow_factor`` also keeps the measurer's default.
    """

    number: int = RunConfig.number
    repeat: int = RunConfig.repeat
    min_repeat_ms: int = RunConfig.min_repeat_ms
    timeout: Optional[float] = None
    enable_cpu_cache_flush: bool = RunConfig.enable_cpu_cache_flush
    slow_factor: Optional[float] = RunConfig.slow_factor
    check_correctness: bool = True


@dataclass(frozen=True)
class BuilderOptions:
    """How candidates are compiled: each build is a Ray task killed after ``timeout`` s (``None``: the
    builder's ``DEFAULT_BUILD_TIMEOUT``), under a memory cap of ``memory_gib`` GiB (``None``: 3/4 of the
    node's memory over its CPUs, >= 2 GiB)."""

    timeout: Optional[float] = None
    memory_gib: Optional[float] = None


@dataclass
class TuningOptions:
    """How much to measure and how.

    Attributes
    ----------
    num_measure_trials
        Total measurements of the task, its history (resumed log, database) included.
    num_measures_per_round
        Candidates measured per round; the cost model retrains after each.
    early_stopping
        Stop after this many trials without improvement (``None``: never).
    seed
        Seed of the search (and of a fresh cost model).
    search
        Knobs of the sketch policy.
    measure_callbacks
        Extra callbacks seeing every result as it arrives (the log writer is always the first).
    builder, runner
        Build timeout; timing, checking and run timeout.
    ray_address
        Ray cluster to join (``None``: ``$RAY_ADDRESS``, else an embedded loopback-only local Ray).
    cost_model
        ``"xgb"`` (default), ``"random"``, or a model object (e.g. ``ansor.cost_model.load_model(path)``).
    pretrained
        Start from what the package ships for the target's kind (docs/pretrained.md): ``"xgb"`` starts from
        the pretrained cost model, and each task first measures the shipped schedule database's records of
        its workload or of the same operator at other sizes. ``False``: start cold.
    """

    num_measure_trials: int = 64
    num_measures_per_round: int = 16
    early_stopping: Optional[int] = None
    seed: int = 0
    search: SearchParams = field(default_factory=SearchParams)
    measure_callbacks: Sequence[MeasureCallback] = ()
    builder: BuilderOptions = field(default_factory=BuilderOptions)
    runner: RunnerOptions = field(default_factory=RunnerOptions)
    ray_address: Optional[str] = None
    cost_model: Any = "xgb"
    pretrained: bool = True

    def __post_init__(self) -> None:
        if self.num_measure_trials <= 0:
            raise AnsorError(f"num_measure_trials must be positive, got {self.num_measure_trials}")
        if self.num_measures_per_round <= 0:
            raise AnsorError(f"num_measures_per_round must be positive, got {self.num_measures_per_round}")
        if self.early_stopping is not None and self.early_stopping <= 0:
            raise AnsorError(f"early_stopping must be positive or None, got {self.early_stopping}")
        if isinstance(self.cost_model, str) and self.cost_model not in ("xgb", "random"):
            raise AnsorError(f"unknown cost model {self.cost_model!r}; valid: 'xgb', 'random', or a model object")


def with_trials(options: Optional[TuningOptions], trials: Optional[int]) -> TuningOptions:
    """``options`` (default :class:`TuningOptions`) with a budget of ``trials`` when given."""
    options = options or TuningOptions()
    return replace(options, num_measure_trials=trials) if trials is not None else options


def make_cost_model(options: TuningOptions, target: Optional["tvm.target.Target"] = None):
    """The cost model ``options`` names for ``target``: a fresh seeded XGBoost model (started from the
    shipped pretrained booster when ``options.pretrained`` and one is shipped) or random model, or the
    object given."""
    if not isinstance(options.cost_model, str):
        return options.cost_model
    from ..cost_model import RandomModel, XGBModel
    if options.cost_model == "random":
        return RandomModel(seed=options.seed)
    if options.pretrained and target is not None:
        from ..cost_model.pretrained import pretrained_model
        model = pretrained_model(target, options.seed)
        if model is not None:
            return model
    return XGBModel(seed=options.seed)


def make_measurer(options: TuningOptions, callbacks: Sequence[MeasureCallback] = ()):
    """A :class:`~ansor.measure.measurer.ProgramMeasurer` on Ray with ``options``' builder and runner.

    ``callbacks`` come first, then ``options.measure_callbacks``. Use it as a context manager.
    """
    from ..measure.measurer import ProgramMeasurer
    run, build = options.runner, options.builder
    optional = {"build_timeout": build.timeout, "build_memory_gib": build.memory_gib, "run_timeout": run.timeout,
                "slow_factor": run.slow_factor}
    return ProgramMeasurer(options.ray_address, callbacks=[*callbacks, *options.measure_callbacks],
                           number=run.number, repeat=run.repeat, min_repeat_ms=run.min_repeat_ms,
                           enable_cpu_cache_flush=run.enable_cpu_cache_flush,
                           check_correctness=run.check_correctness,
                           **{k: v for k, v in optional.items() if v is not None})


def ray_session(address: Optional[str] = None):
    """Start (or join) Ray once for several tuning calls; returns the session (``close()`` it when done).

    Each tuning call otherwise starts an embedded Ray and stops it at its end (seconds each); calls made
    while a session is open reuse it. The embedded instance listens on 127.0.0.1 only; ``address`` (or
    ``$RAY_ADDRESS``) joins a cluster instead. The session is closed at interpreter exit in any case.
    """
    from ..measure.ray_session import RaySession
    return RaySession.open(address)
