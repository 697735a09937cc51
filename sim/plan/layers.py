"""Per micro-batch costs of one layer of each kind on one rank, for the fast estimate.

Compute is the simulator's: the kernels of :mod:`sim.model.layers` that
:mod:`sim.parallel.passes` runs for a layer (attention, MLP or router + experts,
embedding, output layer), timed by the same :class:`~sim.model.compute.ComputeModel`.
Communication is in closed form (:mod:`.comm`): TP all-gathers and reduce-scatters
around each sublayer are exposed (with ``tp_comm_overlap``: only what outlasts the
sublayer's GEMMs, and at least the last of TransformerEngine's 4 reduce-scatter chunks);
CP's ring attention exposes what each K/V shift takes beyond one attention chunk; the
MoE all-to-alls are returned whole (what EP overlap hides depends on the schedule:
:mod:`.estimate`). Recompute adds the forward again (full) or the attention core
(selective).
"""

from collections import Counter
from dataclasses import dataclass, replace

from ..model.compute import quantized
from ..model.layers import (ELEM, Shard, attention_core, attention_post, attention_pre, backward, embedding,
                            entry_width, experts, local_sort, logits, mlp, mlp_block, router,
                            unpermute)
from ..parallel.layout import Layout
from ..parallel.tp_overlap import RS_SPLITS

KINDS = ("dense", "moe", "embedding", "output")


@dataclass(frozen=True)
class Cost:
    """Seconds per micro-batch of one layer: forward and backward compute, recomputation,
    exposed TP and CP communication, the MoE all-to-alls (all four, unhidden)."""

    forward: float = 0.0
    backward: float = 0.0
    recompute: float = 0.0
    tp: float = 0.0
    cp: float = 0.0
    ep: float = 0.0


class LayerCosts:
    """Costs of each layer kind for one (tp, cp, micro_batch, recompute, overlap, ep, expert_tp)."""

    def __init__(self, scenario, dims, compute, comm, key: tuple, groups: dict):
        self.s, self.d, self.time, self.comm, self.groups = scenario, dims, compute.time, comm, groups
        tp, cp, mb, self.rec, self.tpov, self.ep, self.etp = key
        t = scenario.training
        self.sh = Shard(mb * t.seq_len // cp, t.seq_len, mb, tp, tp > 1, t.flash_attention, quantized(t.precision),
                        t.precision if quantized(t.precision) else "fp8")
        self.tp_n, self.cp_n = tp, cp

    # ------------------------------------------------------------------ communication
    def _tp(self, op: str, nbytes: float, gemm: float = 0.0, overlap: bool = False) -> float:
        t = self.comm.reduce(op, nbytes, self.groups["tp"]) if self.tp_n > 1 else 0.0
        return max(t / RS_SPLITS, t - gemm) if overlap else t

    def _sublayer_tp(self, entry: int, fwd: float, bwd: float) -> float:
        """A dense sublayer's four TP collectives (forward gather + reduce-scatter, backward
        gather of the output gradient + reduce-scatter of the input gradient), tp.sublayer_bytes."""
        sh, h = self.sh, self.d.h
        gather = 1 if sh.fp8 else ELEM
        ag_in, rs_out = sh.tokens * entry * gather, sh.tokens * h * ELEM
        ag_grad, rs_grad = sh.tokens * h * gather, sh.tokens * entry * ELEM
        ov = self.tpov
        return (self._tp("all_gather", ag_in, fwd / 2, ov) + self._tp("reduce_scatter", rs_out, fwd / 2, ov)
                + self._tp("all_gather", ag_grad, bwd / 2, ov) + self._tp("reduce_scatter", rs_grad, bwd / 2, ov))

    def _attention(self) -> tuple[float, float, float, float, float]:
        """(forward, backward, core forward, exposed TP, exposed CP) of the attention sublayer."""
        d, sh, cp = self.d, self.sh, self.cp_n
        core = attention_core(d, sh, 1.0 / cp)
        core_f, core_b = cp * self.time([core]), cp * self.time(backward([core]))
        pre, post = attention_pre(d, sh), attention_post(d, sh)
        fwd = self.time(pre) + core_f + self.time(post)
        bwd = self.time(backward(pre)) + core_b + self.time(backward(post))
        exposed_cp = 0.0
        if cp > 1:
            kv = ELEM * sh.tokens * d.kv_width / sh.tp
            shift = self.comm.p2p(kv, self.groups["cp"])
            exposed_cp = (cp - 1) * (max(0.0, shift - core_f / cp) + max(0.0, 2 * shift - core_b / cp))
        exposed_tp = self._sublayer_tp(entry_width(d), fwd - core_f, bwd - core_b)
        return fwd, bwd, core_f, exposed_tp, exposed_cp

    # ------------------------------------------------------------------ layer kinds
    def dense(self) -> Cost:
        f_a, b_a, core_f, tp_a, cp_a = self._attention()
        block = mlp_block(self.d, self.sh)
        f_m, b_m = self.time(block), self.time(backward(block))
        tp_m = self._sublayer_tp(self.d.h, f_m, b_m)
        return self._recomputed(f_a + f_m, b_a + b_m, core_f, tp_a + tp_m, cp_a, 0.0)

    def moe(self) -> Cost:
        """Attention, then router -> dispatch -> experts -> combine (:mod:`sim.parallel.ep`)."""
        f_a, b_a, core_f, tp_a, cp_a = self._attention()
        d, sh = self.d, self.sh
        layout = Layout({"tp": self.tp_n, "cp": 1, "dp": self.ep, "pp": 1}, ("tp", "cp", "dp", "pp"), self.ep,
                        self.etp, sh.sp)
        folded = layout.folded_experts
        own = replace(sh, tokens=layout.moe_tokens(sh.tokens), tp=1, sp=False) if folded else sh
        # router (and permute); shared experts and the residual; the unpermutation
        kernels = list(router(d, own)) + list(experts(d, sh, ())) + list(unpermute(d, own.tokens))
        plain = 2 * (self._tp("all_gather", sh.tokens * d.h * ELEM) + self._tp("reduce_scatter", sh.tokens * d.h * ELEM))
        if not folded:  # the tp group gathers the tokens before and reduce-scatters after (plain collectives)
            tp_m, routed = plain, self._routed(sh, 1)
        else:  # shared experts on the attention's tp group; routed ones on the expert-tp group
            tp_m, routed = (plain if d.shared else 0.0), self._routed(replace(sh, tp=self.etp), self.etp)
            if self.etp > 1:
                nbytes = self.etp * ELEM * sum(self.loads) * d.h
                tp_m += 2 * (self.comm.reduce("all_gather", nbytes, self.groups["etp"])
                             + self.comm.reduce("reduce_scatter", nbytes, self.groups["etp"]))
        f_m, b_m = self.time(kernels) + routed[0], self.time(backward(kernels)) + routed[1]
        a2a = self.comm.all_to_all(ELEM * self.dispatched * d.h, self.groups["ep"]) if self.ep > 1 else 0.0
        return self._recomputed(f_a + f_m, b_a + b_m, core_f, tp_a + tp_m, cp_a, 4 * a2a)

    def _routed(self, sh: Shard, scale: int) -> tuple[float, float]:
        """(forward, backward) seconds of the local experts' MLPs on their loads (x ``scale``
        tokens when the expert-tp group gathered them): a sum over experts, so experts with
        equal loads are timed once."""
        sort = local_sort(len(self.loads), scale * sum(self.loads), self.d.h)
        fwd, bwd = 2 * self.time(sort), 2 * self.time(backward(sort))
        for load, n in sorted(Counter(self.loads).items()):
            kernels = mlp(self.d, sh, self.d.f_expert, load * scale)
            fwd, bwd = fwd + n * self.time(kernels), bwd + n * self.time(backward(kernels))
        return fwd, bwd

    def embedding(self) -> Cost:
        f, b = self.time(embedding(self.d, self.sh)), self.time(backward(embedding(self.d, self.sh)))
        nbytes = self.sh.tokens * self.d.h * ELEM
        return Cost(f, b, 0.0, self._tp("reduce_scatter", nbytes) + self._tp("all_gather", nbytes))

    def output(self) -> Cost:
        f, b = self.time(logits(self.d, self.sh)), self.time(backward(logits(self.d, self.sh)))
        nbytes = self.sh.tokens * self.d.h * ELEM
        return Cost(f, b, 0.0, self._tp("all_gather", nbytes) + self._tp("reduce_scatter", nbytes))

    def _recomputed(self, fwd: float, bwd: float, core_f: float, tp: float, cp: float, ep: float) -> Cost:
        """Full recompute runs the forward (compute and its forward communication) again
        before the backward; selective only the attention core (and its K/V shifts)."""
        if self.rec == "full":
            return Cost(fwd, bwd, fwd, tp * 1.5, cp * 4 / 3, ep * 1.5)
        if self.rec == "selective":
            return Cost(fwd, bwd, core_f, tp, cp * 4 / 3, ep)
        return Cost(fwd, bwd, 0.0, tp, cp, ep)

    # ------------------------------------------------------------------ expert loads
    loads: tuple[float, ...] = ()  # tokens per local expert on the busiest ep rank (set by the caller)
    dispatched: float = 0.0  # tokens x top_k a rank sends per all-to-all

    def costs(self) -> dict[str, Cost]:
        """Every kind's cost."""
        out = {"dense": self.dense(), "embedding": self.embedding(), "output": self.output()}
        if self.d.experts:
            out["moe"] = self.moe()
        return out
