"""Cost models: rank candidate programs so only promising ones are measured (see DESIGN.md).

``CostModel`` is the interface the search uses; ``RandomModel`` the baseline; ``XGBModel`` Ansor's
pack-sum XGBoost model over TVM's per-store features; ``load_model`` reads any saved model.
"""

from .cost_model import CostModel, CostModelError, RandomModel, load_model
from .features import FeatureExtractor
from .xgb_model import XGBModel, XGBParams

__all__ = ["CostModel", "CostModelError", "FeatureExtractor", "RandomModel", "XGBModel", "XGBParams", "load_model"]
