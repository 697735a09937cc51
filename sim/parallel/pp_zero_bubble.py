"""Zero-bubble pipeline schedules (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024;
sail-sg/zero-bubble-pipeline-parallelism) and DeepSeek's DualPipe / DualPipeV
(DeepSeek-V3 technical report, arXiv 2412.19437 section 3.2.1; deepseek-ai/DualPipe).

Each schedule is a per-rank list of steps; a step is one item, or two items that run as
one overlapped forward-and-backward (DualPipe's ``_forward_backward_chunk``). An item is
``(kind, micro_batch, chunk)`` with kind (:class:`Kind`):

- ``F``: the chunk's forward;
- ``B``: its whole backward (input and weight gradients, as 1F1B runs it);
- ``I``: its input-gradient backward only (the zero-bubble "B"), the weight-gradient GEMMs
  recorded and deferred (:func:`sim.parallel.tp.grad_parts` splits a GEMM's backward);
- ``W``: the deferred weight gradients of an earlier ``I`` (the zero-bubble "W").

Schedules (``p`` ranks, ``m`` micro-batches, ``s`` the rank's stage):

- ``zb-h1``: 1F1B's order with ``B`` split, each rank holding back its first ``s`` W's
  (PyTorch's torch/distributed/pipelining/schedules.py ``_get_1f1b_rank_ops`` with
  ``num_1f1b_microbatches=rank``, the ZB-H1 of the paper's figure 3): every rank keeps
  ``p`` micro-batches in flight (1F1B's peak) and the bubble is (p-1)(F+B-W).
- ``zb-h2``: up to 2p-1 micro-batches in flight; the order is the list schedule that runs a
  ready B first, else a forward while fewer than 2p-1 are in flight, else the oldest pending
  W, for equal F, B, W (the greedy that the repo's ``zb.py`` ``Graph.manual_order`` starts
  its search from, with ZB-H2's memory limit).
- ``zb-v``: two chunks per rank in a V (rank s holds virtual stages s and 2p-1-s, so the
  first and last stages share rank 0; the repo's ``zbv.py``, ``--zero-bubble-v-schedule``),
  the same list-schedule rule on chunks of half a stage with 1F1B's activation memory
  (2p chunks in flight).
- ``dualpipe``: deepseek-ai/DualPipe dualpipe.py ``DualPipe.step``: half the micro-batches
  enter at rank 0, half at rank p-1; rank s holds stage s for the first direction and stage
  p-1-s for the second (two parameter copies); its eight steps verbatim.
- ``dualpipev``: dualpipev.py ``DualPipeV.step``: the "cut-in-half" V of DualPipe, every
  micro-batch entering at rank 0, rank s holding virtual stages s and 2p-1-s.

Run ``clustersim run SCENARIO --set parallel.schedule=zb-h1`` (or ``zb-h2``, ``zb-v``,
``dualpipe``, ``dualpipev``).
"""

from enum import Enum
from functools import lru_cache

from ..input.scenario import V_SCHEDULES as V_SHAPED, ZERO_BUBBLE_SCHEDULES as ZERO_BUBBLE


class Kind(str, Enum):
    """What a schedule item computes (the string values are the papers' letters)."""

    F = "F"
    B = "B"  # whole backward
    I = "I"  # input gradient only (the zero-bubble B)  # noqa: E741
    W = "W"  # deferred weight gradient


__all__ = ["Kind", "V_SHAPED", "ZERO_BUBBLE", "stage_of", "steps", "virtual_stage"]


def virtual_stage(schedule: str, p: int, stage: int, chunk: int) -> int:
    """Index (into the scenario's stage split) of the layers chunk ``chunk`` of ``stage`` runs."""
    if schedule in V_SHAPED:
        return stage if chunk == 0 else 2 * p - 1 - stage
    if schedule == "dualpipe":
        return stage if chunk == 0 else p - 1 - stage
    return chunk * p + stage


def stage_of(schedule: str, p: int, vs: int, chunk: int) -> int:
    """The pipeline rank coordinate that runs virtual stage ``vs`` in ``chunk``'s pipeline."""
    if schedule in V_SHAPED:
        return vs if vs < p else 2 * p - 1 - vs
    if schedule == "dualpipe":
        return vs if chunk == 0 else p - 1 - vs
    return vs % p


@lru_cache(maxsize=256)
def steps(schedule: str, p: int, m: int, stage: int) -> tuple:
    """The rank's steps (tuples of one or two items), built once per (schedule, p, m, stage)."""
    if schedule == "zb-h1":
        return tuple((item,) for item in _zb_h1(p, m, stage))
    if schedule == "zb-h2":
        return tuple((item,) for item in _list_schedule(p, m, 1, 2 * p - 1)[stage])
    if schedule == "zb-v":
        return tuple((item,) for item in _list_schedule(p, m, 2, 2 * p)[stage])
    return tuple(_dualpipe(p, m, stage, schedule == "dualpipev"))


def _zb_h1(p: int, m: int, s: int) -> list[tuple]:
    """ZB-H1: 1F1B's warm-up and steady state with B split; W after each B from the
    rank's (s+1)-th on, the held-back ones at the end."""
    warmup = min(p - 1 - s, m)
    out = [(Kind.F, k, 0) for k in range(warmup)]
    pending, issued = [], 0
    for k in range(m):
        if k + warmup < m:
            out.append((Kind.F, k + warmup, 0))
        out.append((Kind.I, k, 0))
        pending.append(k)
        if issued >= s:
            out.append((Kind.W, pending.pop(0), 0))
        issued += 1
    return out + [(Kind.W, k, 0) for k in pending]


@lru_cache(maxsize=64)
def _list_schedule(p: int, m: int, chunks: int, limit: int) -> tuple:
    """Unit-time list schedule of every rank at once: at each time unit a free rank runs
    a ready input-gradient pass, else a ready forward while fewer than ``limit`` chunk
    activations are held (forward done, W not yet), else its oldest pending W; among
    chunks, the later virtual stage first (it frees memory sooner)."""
    stages = chunks * p
    f_end, b_end = {}, {}
    nxt_f, nxt_b = [[0] * chunks for _ in range(p)], [[0] * chunks for _ in range(p)]
    held, pending, orders, time = [0] * p, [[] for _ in range(p)], [[] for _ in range(p)], 0
    done = lambda: all(not pending[s] and all(n == m for n in nxt_b[s]) for s in range(p))
    while not done():
        for s in range(p):
            item = _pick(p, m, chunks, stages, s, time, f_end, b_end, nxt_f, nxt_b, held[s] < limit, pending[s])
            if item is None:
                continue
            kind, k, c = item
            vs = virtual_stage("zb-v" if chunks == 2 else "1f1b", p, s, c)
            if kind is Kind.F:
                f_end[vs, k] = time + 1
                nxt_f[s][c] += 1
                held[s] += 1
            elif kind is Kind.I:
                b_end[vs, k] = time + 1
                nxt_b[s][c] += 1
                pending[s].append((k, c))
            else:
                pending[s].pop(0)
                held[s] -= 1
            orders[s].append(item)
        time += 1
    return tuple(tuple(o) for o in orders)


def _pick(p, m, chunks, stages, s, time, f_end, b_end, nxt_f, nxt_b, room: bool, pending: list):
    """The item rank ``s`` starts at ``time`` under :func:`_list_schedule`'s rule, or None."""
    order = range(chunks - 1, -1, -1)
    for c in order:
        k, vs = nxt_b[s][c], virtual_stage("zb-v" if chunks == 2 else "1f1b", p, s, c)
        if k < nxt_f[s][c] and (b_end.get((vs + 1, k), time + 1) if vs < stages - 1
                                else f_end.get((vs, k), time + 1)) <= time:
            return Kind.I, k, c
    for c in order:
        k, vs = nxt_f[s][c], virtual_stage("zb-v" if chunks == 2 else "1f1b", p, s, c)
        if room and k < m and (vs == 0 or f_end.get((vs - 1, k), time + 1) <= time):
            return Kind.F, k, c
    if pending:
        k, c = pending[0]
        return Kind.W, k, c
    return None


class _Steps:
    """Builds one rank's DualPipe step list with the reference's counters: forward and
    backward chunk ids per phase, and the FIFO of deferred weight gradients
    (dualpipe/utils.py ``WeightGradStore``)."""

    def __init__(self, chunk_of, offset):
        self.chunk_of, self.offset = chunk_of, offset  # phase -> chunk; chunk -> first micro-batch
        self.f, self.b, self.store, self.out = [0, 0], [0, 0], [], []

    def _item(self, kind: Kind, phase: int, counter: list) -> tuple:
        c = self.chunk_of(phase)
        k = counter[c] + self.offset[c]
        counter[c] += 1
        return kind, k, c

    def forward(self, phase: int) -> None:
        self.out.append((self._item(Kind.F, phase, self.f),))

    def backward(self, phase: int, zb: bool = False) -> None:
        item = self._item(Kind.I if zb else Kind.B, phase, self.b)
        self.store += [item] if zb else []
        self.out.append((item,))

    def weight(self) -> None:
        _, k, c = self.store.pop(0)
        self.out.append(((Kind.W, k, c),))

    def pair(self, phase0: int, phase1: int) -> None:
        self.out.append((self._item(Kind.F, phase0, self.f), self._item(Kind.B, phase1, self.b)))


def _dualpipe(p: int, m: int, rank: int, v_shape: bool) -> list[tuple]:
    """``DualPipe.step`` (``DualPipeV.step`` when ``v_shape``), steps 1 to 8 as written there:
    DualPipe runs them with half the ranks and half the micro-batches per direction, phase 0
    meaning the reverse direction on the second half of the ranks."""
    if v_shape:
        n, r, half, middle = p, rank, m, rank == p - 1
        st = _Steps(lambda phase: phase, (0, 0))
    else:
        n, r, half = p // 2, min(rank, p - 1 - rank), m // 2
        middle, second = rank in (p // 2 - 1, p // 2), int(rank >= p // 2)
        st = _Steps(lambda phase: phase ^ second, (0, m // 2))
    for _ in range((n - r - 1) * 2):  # step 1: nF0
        st.forward(0)
    for _ in range(r + 1):  # step 2: nF0F1
        st.forward(0)
        st.forward(1)
    for _ in range(n - r - 1):  # step 3: nB1W1F1 (zero bubble)
        st.backward(1, zb=True)
        st.weight()
        st.forward(1)
    for i in range(half - 2 * n + r + 1):  # step 4 (main): nF0B1F1B0
        if i == 0 and middle:  # "we don't overlap these two chunks to further reduce bubble size"
            st.forward(0)
            st.backward(1)
        else:
            st.pair(0, 1)
        st.pair(1, 0)
    for _ in range(n - r - 1):  # step 5: nB1F1B0
        st.backward(1)
        st.pair(1, 0)
    zb = False
    for i in range(r + 1):  # step 6: nB1B0, the second half with zero bubble
        zb = zb or (i == (r + 1) // 2 and r % 2 == 1)
        st.backward(1, zb)
        zb = zb or (i == (r + 1) // 2 and r % 2 == 0)
        st.backward(0, zb)
    for _ in range(n - r - 1):  # step 7: nWB0
        st.weight()
        st.backward(0, zb=True)
    for _ in range(r + 1):  # step 8: nW
        st.weight()
    assert not st.store
    return st.out


@lru_cache(maxsize=256)
def peaks(schedule: str, p: int, m: int, stage: int) -> tuple[int, int]:
    """(most chunk activations held: forward done, weight gradient not yet; most chunks
    whose weight gradients are pending: input gradient done, W not yet) on the rank.
    Taken apart, their sum bounds what is held at once from above."""
    held = pending = top_held = top_pending = 0
    for step in steps(schedule, p, m, stage):
        for kind, _, _ in step:
            held += {Kind.F: 1, Kind.B: -1, Kind.W: -1}.get(kind, 0)
            pending += {Kind.I: 1, Kind.W: -1}.get(kind, 0)
            top_held, top_pending = max(top_held, held), max(top_pending, pending)
    return top_held, top_pending
