"""Forward and backward passes of one pipeline chunk for one micro-batch: each layer is
compute wrapped in TP (and CP, EP) collectives, FSDP gathers layers around it, and the
backward hands each layer's gradients to the DP / ZeRO buckets.

A transformer layer is four pieces, Megatron-Core's split for EP all-to-all overlap
(megatron/core/models/common/model_chunk_schedule_plan.py, TransformerLayerSchedulePlan):
forward = attention (and the router), dispatch, MLP (experts), combine; backward =
combine, MLP, dispatch, attention. A pass runs them in order; :mod:`.ep_overlap`
interleaves the pieces of a forward and a backward pass. A dense layer's dispatch and
combine are empty; the embedding and the output layer are one piece. A multi-token-
prediction depth is a transformer layer whose first piece begins with its input (the
shifted tokens' embedding, two norms, eh_proj between an all-gather of its 2h-wide input
and one of its output) and whose last piece ends with its own pass through the output
head (multi_token_prediction.py, MultiTokenPredictionLayer.forward).
"""

from ..engine.kinds import Phase
from ..input.choices import Recompute
from ..model import transformer as model_costs
from ..model.layer_ids import is_block, is_embedding, is_mtp, is_output
from ..model.layers import (ELEM, Direction, attention_post, attention_pre, backward, entry_width, mla_up_recompute,
                            mlp_block, op_recompute)
from ..model.vocab import embedding, embedding_weight_grad, logits, mtp_input
from . import cp, dp, ep, fsdp, tp, tp_overlap, wgrad_deferral
from .pp_zero_bubble import Kind

FWD, BWD = Direction.FWD, Direction.BWD
PIECES = 4


def _same(x):
    return x


def _tp(b):
    """The TP sublayer functions: overlapped (TE userbuffers) or plain collectives."""
    return tp_overlap if b.ctx.scenario.parallel.tp_comm_overlap else tp


class Pass:
    """One chunk's forward (:attr:`Kind.F`) or backward (:attr:`Kind.B`) of one micro-batch;
    ``x`` is the op the next piece depends on. Its ops are of ``phase`` (forward or backward;
    a recomputation inside the backward: recompute). ``defer``: a zero-bubble input-gradient
    pass, whose weight-gradient GEMMs are recorded (:attr:`wgrads`) for :func:`weight_pass`
    to run later."""

    def __init__(self, b, layer_ids: list[int], mb: int, deps, direction: Kind, param_waits: dict | None = None,
                 sync=None, last_mb: bool = False, defer: bool = False):
        direction = Kind(direction)  # (a schedule letter given as a plain "F"/"B" is the same pass)
        self.b, self.mb, self.direction, self.x = b, mb, direction, deps
        self.layers = layer_ids if direction is Kind.F else layer_ids[::-1]
        self.phase = Phase.FORWARD if direction is Kind.F else Phase.BACKWARD
        self.gather = fsdp.Gatherer(b, self.layers, mb, FWD if direction is Kind.F else BWD)
        self.param_waits, self.sync, self.last_mb, self.rs_ops = param_waits or {}, sync, last_mb, []
        self.wgrads, self.layer_end = ([], {}) if defer else (None, None)
        self.fp8_mark = b.fp8_gemms  # (sim/parallel/amax.py: the FP8 GEMMs this pass builds)

    def _fns(self, layer: int) -> tuple:
        b, mb = self.b, self.mb
        if self.direction is Kind.F:
            return forward_pieces(b, layer, mb)
        fns = backward_pieces(b, layer, mb)
        return fns if self.wgrads is None else tuple(lambda x, f=f: self._deferring(f, x) for f in fns)

    def _deferring(self, fn, x):
        """Run a backward piece with its weight gradients recorded instead of computed."""
        self.b.deferred = self.wgrads
        try:
            return fn(x)
        finally:
            self.b.deferred = None

    def pieces(self, layer: int) -> list:
        """Thunks running ``layer``'s pieces in order, each advancing ``x``."""
        steps = [lambda f=f, k=k: setattr(self, "x", self._issued(layer, k, f)(self.x))
                 for k, f in enumerate(self._fns(layer))]
        whole = [lambda: (self._begin(layer), steps[0]())] + steps[1:-1] + [lambda: (steps[-1](), self._end(layer))]
        return [lambda step=step: self._in_phase(step) for step in whole]

    def _issued(self, layer: int, piece: int, fn):
        """``fn`` run inside a CUDA-graph region when the piece is captured (:func:`captured`)."""
        if fn is _same or not captured(self.b, layer, piece, self.direction):
            return fn

        def run(x):
            with self.b.graphed():
                return fn(x)
        return run

    def _in_phase(self, step) -> None:
        with self.b.phase_of(self.phase):
            step()

    def _begin(self, layer: int) -> None:
        if self.direction is Kind.F:
            self.x = (self.x, self.gather.before(layer), self.param_waits.get(layer))
            return
        self.x = (self.x, self.gather.before(layer))
        recompute = self.b.ctx.scenario.training.recompute
        if recompute is Recompute.FULL and is_block(self.b.ctx.dims, layer):
            with self.b.phase_of(Phase.RECOMPUTE):
                self.x = layer_forward(self.b, layer, self.mb, self.x, recompute=True)
        elif recompute is Recompute.OP and is_block(self.b.ctx.dims, layer):
            with self.b.phase_of(Phase.RECOMPUTE):
                self.x = self.b.compute("op_recompute", op_recompute(self.b.ctx.dims, self.b.ctx.shard), self.x,
                                        layer, self.mb)

    def _end(self, layer: int) -> None:
        self.gather.after(layer, self.x)
        if self.direction is Kind.F:
            return
        if self.wgrads is not None:  # gradients are ready after the W pass
            self.layer_end[layer] = self.x
            return
        acc = fsdp.accumulate(self.b, layer, self.mb, self.x)
        self.x = self.x if acc is None else acc
        if self.last_mb:
            rs = fsdp.reduce_scatter(self.b, layer, self.mb, self.x)
            self.rs_ops += [rs] if rs is not None else []
        if self.sync is not None:
            self.sync.add(layer, self.x)

    def run(self, layers=None) -> None:
        """Run ``layers`` (default: all of the chunk's) piece after piece."""
        with self.b.phase_of(self.phase):
            for layer in self.layers if layers is None else layers:
                self._begin(layer)
                for k, fn in enumerate(self._fns(layer)):
                    self.x = self._issued(layer, k, fn)(self.x)
                self._end(layer)

    def finish(self) -> None:
        """Backward: flush the last gradient bucket."""
        if self.direction is Kind.B and self.sync is not None and self.wgrads is None:
            with self.b.phase_of(self.phase):
                self.sync.flush(self.x)


def captured(b, layer: int, piece: int, direction: Kind) -> bool:
    """Whether a piece of a layer replays as a CUDA graph under ``training.cuda_graphs``:
    every piece of a dense transformer layer (Megatron's per-layer graphs); of an MoE layer
    the attention with the router and the dispatch preprocessing (forward: the first piece;
    backward: the last), whose shapes are static -- the routed experts and their all-to-alls
    have data-dependent shapes under dropless routing, so they are captured only when every
    expert's buffer is padded to capacity (``--cuda-graph-scope attn moe_router
    moe_preprocess``, and ``moe`` for token-drop only: NVIDIA/Megatron-LM docs/discussions/
    deepseek-v3-gb200-optimization, section 2.3). The embedding, output layer and MTP depths
    are not captured (TransformerLayer graphs only)."""
    d = b.ctx.dims
    if not b.ctx.scenario.training.cuda_graphs or not is_block(d, layer) or is_mtp(d, layer):
        return False
    moe = b.ctx.scenario.model.moe
    if not model_costs.is_moe_layer(d, layer) or (moe is not None and moe.padded):
        return True
    return piece == (0 if direction is Kind.F else PIECES - 1)


def weight_pass(ipass: Pass) -> int:
    """The W pass of a deferred input-gradient pass: its weight-gradient GEMMs, layer by
    layer, named ``<input-gradient op>_wgrad``, each after the op it was split from; on the
    last micro-batch each layer's gradients go to the DP buckets after its W ops."""
    b, x, by_layer = ipass.b, ipass.x, {}
    for name, kernels, deps, layer, mb in ipass.wgrads:
        x = b.compute(f"{name}_wgrad", kernels, (deps, x), layer, mb, weights=False)
        by_layer[layer] = x
    if ipass.sync is not None:
        for layer in ipass.layers:
            ipass.sync.add(layer, by_layer.get(layer, ipass.layer_end[layer]))
        ipass.sync.flush(x)
    return x


def layer_forward(b, layer: int, mb: int, deps, recompute: bool = False) -> int:
    """Embedding, output layer, or a transformer layer: attention then MLP."""
    x = deps
    for piece in forward_pieces(b, layer, mb, recompute):
        x = piece(x)
    return x


def forward_pieces(b, layer: int, mb: int, recompute: bool = False) -> tuple:
    """The forward pieces of ``layer``: functions deps -> op."""
    d, tag = b.ctx.dims, "recompute" if recompute else "fwd"
    if is_embedding(layer):
        return (lambda x: tp.exit(b, "embed", layer, mb, b.compute("embedding_fwd", embedding(d, b.ctx.shard), x,
                                                                   layer, mb)),) + (_same,) * (PIECES - 1)
    if is_output(d, layer):
        return (lambda x: b.compute(f"logits_{tag}", logits(d, b.ctx.shard),
                                    tp.enter(b, "logits", layer, mb, x, tag=(tag,)), layer, mb),) + (_same,) * 3
    if is_mtp(d, layer) and not recompute:  # (full recompute reruns only its transformer layer)
        return _mtp_forward(b, layer, mb, tag, _block_forward_pieces(b, layer, mb, tag))
    return _block_forward_pieces(b, layer, mb, tag)


def _block_forward_pieces(b, layer: int, mb: int, tag: str) -> tuple:
    """The forward pieces of a transformer layer."""
    d = b.ctx.dims
    if not model_costs.is_moe_layer(d, layer):
        mlp = lambda x: _tp(b).forward_sublayer(b, "mlp", f"mlp_{tag}", mlp_block, layer, mb, x, tag, True, True)
        return lambda x: attention_forward(b, layer, mb, x, tag), _same, mlp, _same
    etag, folded = "" if tag == "fwd" else "_recompute", b.ctx.layout.folded_experts

    def pre(x):
        x = attention_forward(b, layer, mb, x, tag)
        return ep.route(b, layer, mb, x if folded else tp.enter(b, "mlp", layer, mb, x, tag=(tag,)), FWD, etag)

    def post(x):
        x = ep.combine(b, layer, mb, x, FWD, etag)
        return x if folded else tp.exit(b, "mlp", layer, mb, x, tag=(tag,))

    return (pre, lambda x: ep.dispatch(b, layer, mb, x, FWD, etag),
            lambda x: ep.compute_experts(b, layer, mb, x, FWD, etag), post)


def attention_forward(b, layer: int, mb: int, x, tag: str):
    """Norm and QKV (after the SP all-gather), attention core, output projection."""
    if b.ctx.shard.mla_column:
        x = tp.mla_column_forward(b, layer, mb, x, tag)
    else:
        x = _tp(b).forward_sublayer(b, "attn", f"attn_pre_{tag}", attention_pre, layer, mb, x, tag, gather=True)
    x = cp.attention(b, layer, mb, x, FWD, "" if tag == "fwd" else "_recompute")
    return _tp(b).forward_sublayer(b, "attn", f"attn_post_{tag}", attention_post, layer, mb, x, tag, scatter=True)


def _embedding_grad(b) -> tuple:
    """The dense weight gradient of a word-embedding lookup, added into the rank's gradient
    buffer (:func:`sim.model.vocab.embedding_weight_grad`): the input embedding's and each MTP
    depth's (multi_token_prediction.py looks the shifted tokens up in the stage's embedding)."""
    return embedding_weight_grad(b.ctx.dims, b.ctx.shard, dp.grad_bytes(b.ctx.scenario.parallel))


def backward_pieces(b, layer: int, mb: int) -> tuple:
    """The backward pieces of ``layer`` (mirror image of :func:`forward_pieces`)."""
    d, sh = b.ctx.dims, b.ctx.shard
    if is_embedding(layer):
        return (lambda x: b.compute("embedding_bwd", backward(embedding(d, sh)) + _embedding_grad(b),
                                    tp.enter_backward(b, "embed", layer, mb, x), layer, mb),) + (_same,) * 3
    if is_output(d, layer):  # (its weight gradient maybe deferred into the pipeline flush)
        return (lambda x: tp.exit_backward(b, "logits", layer, mb, wgrad_deferral.output_backward(
            b, "logits_bwd", backward(logits(d, sh)), x, layer, mb)),) + (_same,) * 3
    if is_mtp(d, layer):
        return _mtp_backward(b, layer, mb, _block_backward_pieces(b, layer, mb))
    return _block_backward_pieces(b, layer, mb)


def _block_backward_pieces(b, layer: int, mb: int) -> tuple:
    """The backward pieces of a transformer layer."""
    d = b.ctx.dims
    if not model_costs.is_moe_layer(d, layer):
        mlp = lambda x: _tp(b).backward_sublayer(b, "mlp", "mlp_bwd", mlp_block, layer, mb, x, True, True)
        return _same, mlp, _same, lambda x: attention_backward(b, layer, mb, x)
    folded = b.ctx.layout.folded_experts

    def first(x):
        x = ep.route(b, layer, mb, x if folded else tp.enter_backward(b, "mlp", layer, mb, x), BWD)
        return ep.dispatch(b, layer, mb, x, BWD)

    def last(x):
        return attention_backward(b, layer, mb, x if folded else tp.exit_backward(b, "mlp", layer, mb, x))

    return (first, lambda x: ep.compute_experts(b, layer, mb, x, BWD),
            lambda x: ep.combine(b, layer, mb, x, BWD), last)


def attention_backward(b, layer: int, mb: int, x):
    """Backward of :func:`attention_forward` (recomputing the core under selective recompute, MLA's
    up projections and RoPE under ``mla_up_proj``)."""
    x = _tp(b).backward_sublayer(b, "attn", "attn_post_bwd", attention_post, layer, mb, x, scattered=True)
    recompute = b.ctx.scenario.training.recompute
    if recompute is Recompute.SELECTIVE:
        with b.phase_of(Phase.RECOMPUTE):
            x = cp.attention(b, layer, mb, x, FWD, "_recompute")  # recompute the attention core
    elif recompute is Recompute.MLA_UP_PROJ:  # MLA's up projections, RoPE and assembly, not the core
        with b.phase_of(Phase.RECOMPUTE):
            x = _up_gather(b, layer, mb, x)
            x = b.compute("attn_up_fwd_recompute", mla_up_recompute(b.ctx.dims, b.ctx.shard), x, layer, mb)
    x = cp.attention(b, layer, mb, x, BWD)
    if b.ctx.shard.mla_column:
        return tp.mla_column_backward(b, layer, mb, x)
    return _tp(b).backward_sublayer(b, "attn", "attn_pre_bwd", attention_pre, layer, mb, x, gathered=True)


def _up_gather(b, layer: int, mb: int, x):
    """The all-gather (SP) of the latents MLA's up projections read, rerun by the ``mla_up_proj``
    recompute (their TELayerNormColumnParallelLinear gathers its input; the rotary key's gather is
    outside the checkpointed function: multi_latent_attention.py at 7094270c); under TP-comm overlap
    userbuffers run it inside the GEMMs (not counted)."""
    if b.ctx.scenario.parallel.tp_comm_overlap:
        return x
    width = entry_width(b.ctx.dims, rotary_key=False) * (1 if b.ctx.shard.fp8 else ELEM)
    return tp.enter(b, "attn_up_recompute", layer, mb, x, ("recompute",), b.ctx.shard.tokens * width)


def _mtp_forward(b, layer: int, mb: int, tag: str, block: tuple) -> tuple:
    """An MTP depth's forward: its input, the transformer layer, its output-head pass."""
    d, sh = b.ctx.dims, b.ctx.shard
    wide = 2 * tp.activation_bytes(b)  # eh_proj's input: embedding and hidden side by side

    def first(x):
        x = b.compute(f"mtp_input_{tag}", mtp_input(d, sh), tp.enter(b, "mtp", layer, mb, x, (tag,), wide), layer, mb)
        return block[0](tp.enter(b, "mtp_out", layer, mb, x, (tag,)))

    def last(x):
        x = tp.enter(b, "mtp_logits", layer, mb, block[-1](x), (tag,))
        return b.compute(f"mtp_logits_{tag}", logits(d, sh), x, layer, mb)

    return (first, *block[1:-1], last)


def _mtp_backward(b, layer: int, mb: int, block: tuple) -> tuple:
    """Mirror image of :func:`_mtp_forward`."""
    d, sh = b.ctx.dims, b.ctx.shard
    wide = 2 * tp.activation_bytes(b)

    def first(x):
        x = tp.exit_backward(b, "mtp_logits", layer, mb, b.compute("mtp_logits_bwd", backward(logits(d, sh)), x,
                                                                   layer, mb))
        return block[0](x)

    def last(x):
        x = tp.exit_backward(b, "mtp_out", layer, mb, block[-1](x))
        x = b.compute("mtp_input_bwd", backward(mtp_input(d, sh)) + _embedding_grad(b), x, layer, mb)
        return tp.exit_backward(b, "mtp", layer, mb, x, wide)

    return (first, *block[1:-1], last)
