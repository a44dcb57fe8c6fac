"""What the schedulers know about a DL model by name: the skew of its tensor sizes.

Tiresias (section 3.3) consolidates a job only when its model is skewed: when one tensor holds most of the
parameters, aggregating it over the network contends badly, so such a job (VGG, AlexNet) runs slower spread
over machines, while the rest interleave their many small tensors well. Its Table 6 gives the largest tensor's
share of the model for ten TensorFlow models; that share is the skew here. A model the table does not list
(EfficientNet, VLAD, BERT, ...) has skew 0: nothing says it is sensitive to placement, so it is placed to
fragment least, as Tiresias places every job its profiler finds unskewed.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

# Tiresias Table 6, "largest tensor ratio", keyed by the names traces use (lower case, no separators).
MODEL_SKEW: Mapping[str, float] = MappingProxyType(
    {
        "vgg19": 0.715,
        "vgg16": 0.743,
        "vgg11": 0.773,
        "alexnet": 0.610,
        "resnet152": 0.039,
        "resnet101": 0.053,
        "resnet50": 0.092,
        "inception4": 0.036,
        "inception3": 0.086,
        "inceptionv3": 0.086,
        "googlenet": 0.146,
    }
)


def model_skew(model: str) -> float:
    """The skew of `model` (case and `-`/`_` ignored), 0 for a model the table does not list."""
    return MODEL_SKEW.get(model.lower().replace("-", "").replace("_", ""), 0.0)
