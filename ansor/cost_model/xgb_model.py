"""XGBModel: Ansor's learned cost model, gradient-boosted trees over per-store features, pack-sum.

Each measured program contributes one row per buffer store (see :mod:`.state_features`), all labelled with the
program's normalised throughput (see :mod:`.dataset`). The booster predicts a number per row; a program's
score is the sum over its rows, and training minimises a loss on those sums (see :mod:`.objective`), so
XGBoost is driven through its public custom-objective API (``xgb.train(obj=..., custom_metric=...)``).

Every ``update`` appends the new measurements; the model retrains from scratch on all kept data (as Ansor
did) when it is next read, so updates between two predictions cost one training, not one each: a network's
warm-up rounds (each task's default schedule and seeds, 1-4 trials, nothing predicted) trained after every
round took 0.14 s of each 0.8 s round, 9 of 57 s in DenseNet-121's first minute (142 tasks).
A model may start from a *prior* booster (the shipped pretrained one, :mod:`.pretrained`): it ranks alone
until the first training, and afterwards the new trees learn only what it gets wrong on this run's
programs (its row predictions are the base margin of training and prediction).
Two caps bound the cost of a round as logs grow: at most ``max_programs_per_task`` programs per task
(:class:`~.dataset.TrainingSet`) and at most ``num_boost_round`` trees, with early stopping when the
training loss stops improving.

This is the only module of the package that imports XGBoost.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any, Optional, Sequence

import numpy as np
import xgboost as xgb

from ..state.loop_state import State
from ..log.measurement import MAX_COST, MeasureInput, MeasureResult
from ..task.search_task import SearchTask
from ..target import physical_cores
from .cost_model import CostModel, CostModelError, PathLike, write_model_file
from .dataset import TrainingSet
from .features import FeatureExtractor
from .objective import OBJECTIVES, make_objective
from .state_features import StateFeatureExtractor

#: Feature sets by name: ours read off the State (default), or TVM's C++ extractor on the replayed program.
FEATURE_SETS = {"state": StateFeatureExtractor, "tvm": FeatureExtractor}

logger = logging.getLogger("ansor")

#: Programs per task kept for retraining (see :class:`~.dataset.TrainingSet`). Measured on the 2-core
#: machine (matmul-512, ~1.7 store rows per program, 100 trees): a retraining takes ~0.45 s at 1,000
#: programs and ~1 s at 5,000 uncapped, ~0.6 s with this cap, and then stays flat however long the log.
MAX_PROGRAMS_PER_TASK = 2048


@dataclass(frozen=True)
class XGBParams:
    """Booster and training settings.

    Defaults come from held-out ranking on real measurements (600 matmul-512 and 400 ResNet-50 conv
    programs timed on this 2-core machine): the rank-aware objective ordered 72 % / 76 % of held-out pairs
    right where Ansor's weighted squared error got 68 % / 65 %; depth 6 ranked as well as Ansor's depth 10
    at a third of the training time; more than ~50 trees did not help. ``num_boost_round`` (with early
    stopping when the training loss stalls) bounds the time of one retraining.
    """

    objective: str = "pack-sum-rank"
    max_depth: int = 6
    eta: float = 0.2
    gamma: float = 0.001
    min_child_weight: float = 0.0
    reg_lambda: float = 1.0
    num_boost_round: int = 100
    early_stopping_rounds: int = 20
    #: XGBoost threads (0: this machine's physical cores). One by default: OpenMP threads spin-wait for
    #: each other, and on the 2-core test machine two threads retrained 25 % faster when it was idle but
    #: up to 40x slower whenever another process held a core (median 3.2 s vs 0.66 s for one thread).
    nthread: int = 1

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise CostModelError(f"unknown objective {self.objective!r}; choose one of {', '.join(OBJECTIVES)}")
        if self.num_boost_round < 1:
            raise CostModelError(f"num_boost_round must be at least 1, got {self.num_boost_round}")


@dataclass
class TrainStats:
    """What the last retraining did (for progress logs and the benchmark)."""

    programs: int = 0
    rows: int = 0
    rounds: int = 0
    seconds: float = 0.0


class XGBModel(CostModel):
    """Pack-sum XGBoost cost model with incremental retraining and cached features.

    ``save`` keeps the kept training data next to the booster, so a loaded model goes on learning from
    everything it was trained on (``--load-model`` followed by tuning), not only from new measurements.

    Parameters
    ----------
    params
        Booster and training settings.
    min_train_programs
        Until this many programs were measured, ``predict`` returns uniform random scores (without
        extracting features): a handful of measurements only teach a model noise.
    max_programs_per_task
        Retraining keeps at most this many programs per task (the best half and the most recent);
        ``None`` keeps all.
    seed
        Seeds the random scores before training and the sampling inside training.
    features
        Which per-store features describe a program: ``"state"`` (computed from the loop State, no TVM
        call) or ``"tvm"`` (TVM's C++ ``PerStoreFeature`` on the replayed program; ~10x slower).
    extractor
        Shares a feature cache between models (a new one of ``features`` by default).
    prior
        A trained booster on the same features whose predictions this model starts from and corrects.
    """

    kind = "xgb"

    def __init__(self, params: Optional[XGBParams] = None, *, min_train_programs: int = 16,
                 max_programs_per_task: Optional[int] = MAX_PROGRAMS_PER_TASK, seed: int = 0,
                 features: str = "state", extractor: Optional[FeatureExtractor | StateFeatureExtractor] = None,
                 prior: Optional[xgb.Booster] = None):
        if extractor is None and features not in FEATURE_SETS:
            raise CostModelError(f"unknown feature set {features!r}; choose one of {', '.join(FEATURE_SETS)}")
        self.params = params or XGBParams()
        self.min_train_programs = min_train_programs
        self.seed = seed
        self.extractor = extractor or FEATURE_SETS[features]()
        self.data = TrainingSet(max_programs_per_task)
        self._booster: Optional[xgb.Booster] = None
        self._stale = False  # data came in since the last training
        self.prior = prior
        self._last_train = TrainStats()
        self._rng = np.random.default_rng(seed)

    # ------------------------------------------------------------------ learning
    def update(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        """Add the measurements (programs TVM cannot replay are dropped); the booster is retrained on
        everything kept when it is next read."""
        if len(inputs) != len(results):
            raise CostModelError(f"update got {len(inputs)} inputs but {len(results)} results")
        by_task: dict[int, list[int]] = defaultdict(list)
        tasks: dict[int, SearchTask] = {}
        for i, inp in enumerate(inputs):
            by_task[id(inp.task)].append(i)
            tasks[id(inp.task)] = inp.task
        dropped = 0
        for tid, idx in by_task.items():
            task = tasks[tid]
            feats = self.extractor.extract(task, [inputs[i].state for i in idx])
            for i, feat in zip(idx, feats):
                if feat is None:
                    dropped += 1
                    continue
                res = results[i]
                self.data.add(_task_key(task), feat, res.mean_cost if res.ok else MAX_COST)
        if dropped:
            logger.info("cost model: %d measured programs cannot be replayed and are not learned from", dropped)
        if len(self.data) >= max(1, self.min_train_programs):
            self._stale = True

    @property
    def booster(self) -> Optional[xgb.Booster]:
        """The run's booster, retrained first if measurements came in since; ``None`` before training."""
        if self._stale:
            self.train()
        return self._booster

    @booster.setter
    def booster(self, booster: Optional[xgb.Booster]) -> None:
        self._booster = booster
        self._stale = False

    @property
    def last_train(self) -> TrainStats:
        """What the latest training saw (after the training that pending measurements call for)."""
        if self._stale:
            self.train()
        return self._last_train

    def train(self) -> None:
        """Retrain from scratch on the kept programs (reading :attr:`booster` after ``update`` calls this)."""
        t0 = time.perf_counter()
        arrays = self.data.arrays()
        if arrays.packs.n_programs == 0:
            raise CostModelError("no training data: update the model with measured programs first")
        packs = arrays.packs
        objective = make_objective(self.params.objective, packs, seed=self.seed)
        dtrain = self._matrix(arrays.rows)

        def obj(preds: np.ndarray, _: xgb.DMatrix) -> tuple[np.ndarray, np.ndarray]:
            return packs.to_rows(*objective.gradient(packs.sums(preds)))

        def metric(preds: np.ndarray, _: xgb.DMatrix) -> tuple[str, float]:
            return objective.name, objective.loss(packs.sums(preds))

        p = self.params
        booster = xgb.train(
            {"max_depth": p.max_depth, "eta": p.eta, "gamma": p.gamma, "min_child_weight": p.min_child_weight,
             "lambda": p.reg_lambda, "base_score": 0.0, "tree_method": "hist", "nthread": self._nthread(),
             "seed": self.seed, "disable_default_eval_metric": 1, "verbosity": 0},
            dtrain, num_boost_round=p.num_boost_round, obj=obj, custom_metric=metric,
            evals=[(dtrain, "train")], early_stopping_rounds=p.early_stopping_rounds, verbose_eval=False)
        rounds = booster.best_iteration + 1
        self.booster = booster[:rounds]  # drop the trees grown after the best round
        self._last_train = TrainStats(packs.n_programs, len(arrays.rows), rounds, time.perf_counter() - t0)
        logger.debug("cost model: trained on %d programs (%d rows) in %d rounds, %.2f s", packs.n_programs,
                     len(arrays.rows), rounds, self.last_train.seconds)

    # ------------------------------------------------------------------ predicting
    @property
    def trained(self) -> bool:
        """Whether predictions mean anything: trained here, or started from a prior."""
        return self.booster is not None or self.prior is not None

    def predict(self, task: SearchTask, states: Sequence[State]) -> np.ndarray:
        if not self.trained:
            return self._rng.uniform(0.0, 1.0, len(states))
        scores = np.full(len(states), -np.inf)
        for i, parts in enumerate(self.predict_stores(task, states)):
            if parts is not None:
                scores[i] = parts.sum()
        return scores

    def predict_stores(self, task: SearchTask, states: Sequence[State]) -> list[Optional[np.ndarray]]:
        """Each state's per-store predictions (their sum is its score); ``None`` where replay fails."""
        if not self.trained:
            raise CostModelError("the model is not trained yet: update it with measured programs first")
        feats = self.extractor.extract(task, states)
        live = [f for f in feats if f is not None]
        if not live:
            return [None] * len(states)
        matrix = self._matrix(np.concatenate(live))
        preds = (self.booster.predict(matrix, output_margin=True) if self.booster is not None
                 else matrix.get_base_margin())
        out: list[Optional[np.ndarray]] = []
        pos = 0
        for f in feats:
            if f is None:
                out.append(None)
            else:
                out.append(preds[pos:pos + len(f)])
                pos += len(f)
        return out

    def _nthread(self) -> int:
        return self.params.nthread or physical_cores()

    def _matrix(self, rows: np.ndarray) -> xgb.DMatrix:
        """``rows`` as XGBoost input, with the prior's row predictions as the base margin."""
        matrix = xgb.DMatrix(rows, nthread=self._nthread())
        if self.prior is not None:
            matrix.set_base_margin(self.prior.predict(matrix, output_margin=True))
        return matrix

    # ------------------------------------------------------------------ files
    def save(self, path: PathLike) -> None:
        """Write the booster, the settings and the kept training data (so training can go on after load)."""
        header = {"kind": self.kind, "features": self.extractor.name, "params": asdict(self.params),
                  "min_train_programs": self.min_train_programs,
                  "max_programs_per_task": self.data.max_programs_per_task, "seed": self.seed,
                  "task_keys": self.data.task_keys}
        arrays = self.data.to_arrays()
        for name, booster in (("booster", self.booster), ("prior", self.prior)):
            if booster is not None:
                arrays[name] = np.frombuffer(bytes(booster.save_raw("ubj")), dtype=np.uint8)
        write_model_file(path, header, arrays)

    @classmethod
    def from_file(cls, header: dict[str, Any], arrays: dict[str, np.ndarray], path: PathLike) -> "XGBModel":
        try:
            model = cls(XGBParams(**header["params"]), min_train_programs=int(header["min_train_programs"]),
                        max_programs_per_task=header["max_programs_per_task"], seed=int(header["seed"]),
                        features=header.get("features", "tvm"))  # files from before the choice: TVM's
            rows = arrays.get("rows")
            if rows is not None and rows.ndim == 2 and len(rows) and rows.shape[1] != model.extractor.num_features:
                raise CostModelError(f"{path}: trained on {rows.shape[1]} {model.extractor.name} features, this "
                                     f"version computes {model.extractor.num_features}; retrain it with "
                                     "scripts/train_cost_model.py")
            model.data = TrainingSet.from_arrays(arrays, list(header["task_keys"]), header["max_programs_per_task"])
            for name in ("booster", "prior"):
                if name in arrays:
                    booster = xgb.Booster(model_file=bytearray(arrays[name].tobytes()))
                    if booster.num_features() != model.extractor.num_features:
                        raise CostModelError(f"{path}: its {name} reads {booster.num_features()} features, this "
                                             f"version computes {model.extractor.num_features}; retrain it with "
                                             "scripts/train_cost_model.py")
                    setattr(model, name, booster)
        except (KeyError, TypeError, ValueError, IndexError, OverflowError, CostModelError,
                xgb.core.XGBoostError) as err:
            raise CostModelError(f"{path}: damaged xgb cost model ({type(err).__name__}: {err})") from None
        return model


def _task_key(task: SearchTask) -> str:
    """Programs are comparable only within one workload on one target: that pair names a task's data."""
    return json.dumps([task.workload_key, task.target_str])
