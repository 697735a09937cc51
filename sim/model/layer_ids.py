"""Layer ids of a model, as a rank program numbers them: the token embedding, the
transformer layers ``0 .. layers-1``, the output layer (``dims.layers``), then the
multi-token-prediction depths (Megatron-Core builds them after the output head, all on the
last pipeline stage: multi_token_prediction.py). The spans table's ``layer`` column holds
these ids; :func:`kind` and the predicates below say what an id is, so no code compares an
id with ``dims.layers`` or -1 itself.
"""

from enum import StrEnum

EMBEDDING = -1  # the token embedding's id (an op of no layer also writes -1: sim.engine.ops.NO_LAYER)


class LayerKind(StrEnum):
    """What a layer id stands for."""

    EMBEDDING = "embedding"
    BLOCK = "block"  # a transformer layer of the main model
    OUTPUT = "output"  # the output layer (final norm and logits)
    MTP = "mtp"  # a multi-token-prediction depth (itself a transformer layer)


def output_id(d) -> int:
    """The output layer's id."""
    return d.layers


def mtp_ids(d) -> range:
    """Layer ids of the multi-token-prediction depths: after the output layer's id."""
    return range(d.layers + 1, d.layers + 1 + d.mtp)


def kind(d, layer: int) -> LayerKind:
    """What ``layer`` is in a model of dims ``d``."""
    if layer == EMBEDDING:
        return LayerKind.EMBEDDING
    if layer < d.layers:
        return LayerKind.BLOCK
    return LayerKind.OUTPUT if layer == d.layers else LayerKind.MTP


def is_embedding(layer: int) -> bool:
    """The token embedding."""
    return layer == EMBEDDING


def is_output(d, layer: int) -> bool:
    """The output layer."""
    return layer == d.layers


def is_mtp(d, layer: int) -> bool:
    """A multi-token-prediction depth."""
    return layer > d.layers


def is_block(d, layer: int) -> bool:
    """A transformer layer (of the main model or of an MTP depth), not a pseudo layer."""
    return layer != EMBEDDING and layer != d.layers


def is_first_mtp(d, layer: int) -> bool:
    """The first MTP depth (it holds the last stage's copy of the embedding)."""
    return layer == d.layers + 1
