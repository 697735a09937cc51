"""Which parameters a rank holds: its tp share of its stage's layers, and of the routed
experts 1/ep of them split over expert_tp ranks (the expert mesh of :mod:`.layout`).

Gradients of dense parameters reduce over the cp*dp ranks; expert gradients over the
ranks holding the same experts (Megatron's expert-data-parallel group).
"""

from ..engine.kinds import Category
from .pp import virtual_stages_of
from ..model.layer_ids import EMBEDDING, is_block, is_embedding, is_first_mtp, is_mtp, is_output, mtp_ids, output_id
from ..model.transformer import attention_params, attention_replicated_params, is_moe_layer, mlp_params


def holds_one_embedding(ctx) -> bool:
    """Whether the output layer reuses the embedding's matrix: tied embeddings
    (``model.tied_embeddings``) on one pipeline stage. With pp > 1 Megatron gives the last
    stage its own copy of the word embeddings, kept equal by an all-reduce of their gradients
    with the first stage every step (NVIDIA/Megatron-LM 285068c8 megatron/model/module.py
    ``initialize_word_embeddings``; :func:`sim.parallel.dp.embedding_grad_sync`)."""
    return ctx.scenario.model.tied_embeddings and ctx.layout.sizes[Category.PP] == 1


def moe_block_ids(d) -> list[int]:
    """Ids of every transformer layer with an MoE MLP (MTP depths included)."""
    return [l for l in [*range(d.layers), *mtp_ids(d)] if is_moe_layer(d, l)]


def layer_params(ctx, layer: int) -> tuple[float, float]:
    """(dense, expert) parameters of ``layer`` on one rank (pseudo layers: embedding, output)."""
    d, tp, ep, etp = ctx.dims, ctx.layout.sizes[Category.TP], ctx.layout.ep, ctx.layout.etp
    if is_embedding(layer):
        return d.v * d.h / tp, 0.0
    if is_output(d, layer):  # tied: one matrix, unless the pipeline puts the output on another stage
        return (0.0 if holds_one_embedding(ctx) else d.v * d.h / tp) + d.h, 0.0
    whole = attention_replicated_params(d) * (1 - 1 / tp)  # MLA's down projections sit whole on every TP rank
    extra = 0.0
    if is_mtp(d, layer):  # an MTP depth: eh_proj (column parallel) and three norms; the first
        # also holds the stage's copy of the embedding (gpt_model.py builds one on the MTP stage)
        extra = 2 * d.h * d.h / tp + 3 * d.h + (d.v * d.h / tp if is_first_mtp(d, layer) else 0.0)
    if is_moe_layer(d, layer):
        routed = d.experts * d.mats * d.h * d.f_expert
        dense = attention_params(d) + mlp_params(d, layer, active=False) - routed
        return dense / tp + whole + extra, routed / (etp * ep)
    return (attention_params(d) + mlp_params(d, layer, active=False)) / tp + whole + extra, 0.0


def stage_layer_ids(ctx, virtual_stage: int) -> list[int]:
    """Layer ids of a virtual stage, with the embedding / output pseudo layers at its ends."""
    ids = list(ctx.stage_layers[virtual_stage])
    if virtual_stage == 0:
        ids = [EMBEDDING] + ids
    if virtual_stage == len(ctx.stage_layers) - 1:
        ids = ids + list(mtp_ids(ctx.dims)) + [output_id(ctx.dims)]
    return ids


def block_ids(ctx, virtual_stage: int) -> list[int]:
    """The transformer layers of a virtual stage (the last one's MTP depths included)."""
    return [l for l in stage_layer_ids(ctx, virtual_stage) if is_block(ctx.dims, l)]


def held_stages(ctx, stage: int) -> list[int]:
    """The virtual stages a rank of pipeline ``stage`` holds (DualPipe: stages s and p-1-s,
    two parameter copies of the model per pipeline: :func:`.pp.virtual_stages_of`)."""
    par = ctx.scenario.parallel
    return virtual_stages_of(par.schedule, ctx.layout.sizes[Category.PP], par.virtual_stages, stage)


def rank_params(ctx, stage: int) -> tuple[float, float]:
    """(dense, expert) parameters a rank of pipeline ``stage`` holds (all its chunks)."""
    dense, expert = 0.0, 0.0
    for vs in held_stages(ctx, stage):
        for layer in stage_layer_ids(ctx, vs):
            dl, el = layer_params(ctx, layer)
            dense, expert = dense + dl, expert + el
    return dense, expert
