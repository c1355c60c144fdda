"""Cost models: rank candidate programs so only promising ones are measured (docs/design.md).

``CostModel`` is the interface the search uses; ``RandomModel`` the baseline; ``XGBModel`` Ansor's
pack-sum XGBoost model over per-store features (computed from the State by ``StateFeatureExtractor``, or
TVM's C++ ones by ``FeatureExtractor``); ``load_model`` reads any saved model.
"""

from .cost_model import CostModel, CostModelError, RandomModel
from .features import FeatureExtractor
from .load import load_model
from .state_features import StateFeatureExtractor
from .xgb_model import XGBModel, XGBParams

__all__ = ["CostModel", "CostModelError", "FeatureExtractor", "RandomModel", "StateFeatureExtractor", "XGBModel",
           "XGBParams", "load_model"]
