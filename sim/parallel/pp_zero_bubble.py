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

import heapq
from enum import StrEnum
from functools import lru_cache

import numpy as np

from ..input.choices import V_SCHEDULES as V_SHAPED, ZERO_BUBBLE_SCHEDULES as ZERO_BUBBLE, Schedule


class Kind(StrEnum):
    """What a schedule item computes (the string values are the papers' letters); every
    schedule's items carry one (:func:`sim.parallel.pp.order` too), read by identity by the
    builder (:mod:`.workload`, :mod:`.passes`, :mod:`.ep_overlap`)."""

    F = "F"
    B = "B"  # whole backward
    I = "I"  # input gradient only (the zero-bubble B)  # noqa: E741
    W = "W"  # deferred weight gradient


EQUAL = (1.0, 1.0, 1.0)  # F, B, W times of the papers' handcrafted schedules

__all__ = ["Kind", "V_SHAPED", "ZERO_BUBBLE", "stage_of", "steps", "virtual_stage"]


def virtual_stage(schedule: Schedule, p: int, stage: int, chunk: int) -> int:
    """Index (into the scenario's stage split) of the layers chunk ``chunk`` of ``stage`` runs."""
    if schedule in V_SHAPED:
        return stage if chunk == 0 else 2 * p - 1 - stage
    if schedule == Schedule.DUALPIPE:
        return stage if chunk == 0 else p - 1 - stage
    return chunk * p + stage


def stage_of(schedule: Schedule, p: int, vs: int, chunk: int) -> int:
    """The pipeline rank coordinate that runs virtual stage ``vs`` in ``chunk``'s pipeline."""
    if schedule in V_SHAPED:
        return vs if vs < p else 2 * p - 1 - vs
    if schedule == Schedule.DUALPIPE:
        return vs if chunk == 0 else p - 1 - vs
    return vs % p


@lru_cache(maxsize=256)
def steps(schedule: Schedule, p: int, m: int, stage: int, costs: tuple = EQUAL) -> tuple:
    """The rank's steps (tuples of one or two items), built once per (schedule, p, m, stage);
    ``costs``: the (F, B, W) times the list schedules of ZB-H2 and ZB-V are built for (the
    zero-bubble runtime builds them from profiled times, runtime.py ``avg_then_mid``)."""
    if schedule == Schedule.ZB_H1:
        return tuple((item,) for item in _zb_h1(p, m, stage))
    if schedule == Schedule.ZB_H2:
        return tuple((item,) for item in _list_schedule(p, m, 1, 2 * p - 1, costs)[stage])
    if schedule == Schedule.ZB_V:
        return tuple((item,) for item in _list_schedule(p, m, 2, 2 * p, costs)[stage])
    return tuple(_dualpipe(p, m, stage, schedule == Schedule.DUALPIPEV))


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
def _list_schedule(p: int, m: int, chunks: int, limit: int, costs: tuple = EQUAL) -> tuple:
    """List schedule of every rank at once with pass times ``costs`` (F, B, W): whenever a
    rank is free it starts a ready input-gradient pass, else a ready forward while fewer
    than ``limit`` chunk activations are held (forward done, W not yet), else its oldest
    pending W; among chunks, the later virtual stage first (it frees memory sooner)."""
    shape = Schedule.ZB_V if chunks == 2 else Schedule.ONE_F_ONE_B
    ends: dict = {}  # ("F" | "B", virtual stage, micro-batch) -> end time
    nxt = {kind: [[0] * chunks for _ in range(p)] for kind in "FB"}
    held, pending, orders, free = [0] * p, [[] for _ in range(p)], [[] for _ in range(p)], [0.0] * p
    events, time = [0.0], 0.0
    while any(pending[s] or any(n < m for n in nxt["B"][s]) for s in range(p)):
        for s in range(p):
            if free[s] > time:
                continue
            item = _pick(p, m, chunks, shape, s, time, ends, nxt, held[s] < limit, pending[s])
            if item is None:
                continue
            kind, k, c = item
            end = time + costs["FIW".index(kind.value)]
            if kind is Kind.W:
                pending[s].pop(0)
                held[s] -= 1
            else:
                ends["F" if kind is Kind.F else "B", virtual_stage(shape, p, s, c), k] = end
                nxt["F" if kind is Kind.F else "B"][s][c] += 1
                held[s] += kind is Kind.F
                pending[s] += [(k, c)] if kind is Kind.I else []
            orders[s].append(item)
            free[s] = end
            heapq.heappush(events, end)
        while events and events[0] <= time:
            heapq.heappop(events)
        time = events[0] if events else time + 1
    return tuple(tuple(o) for o in orders)


def _pick(p, m, chunks, shape, s, time, ends, nxt, room: bool, pending: list):
    """The item rank ``s`` starts at ``time`` under :func:`_list_schedule`'s rule, or None."""
    last, never = chunks * p - 1, time + 1
    for c in range(chunks - 1, -1, -1):
        k, vs = nxt["B"][s][c], virtual_stage(shape, p, s, c)
        ready = ends.get(("B", vs + 1, k), never) if vs < last else ends.get(("F", vs, k), never)
        if k < nxt["F"][s][c] and ready <= time:
            return Kind.I, k, c
    for c in range(chunks - 1, -1, -1):
        k, vs = nxt["F"][s][c], virtual_stage(shape, p, s, c)
        if room and k < m and (vs == 0 or ends.get(("F", vs - 1, k), never) <= time):
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
def peaks(schedule: Schedule, p: int, m: int, stage: int, costs: tuple = EQUAL) -> tuple[int, int]:
    """(most chunk activations held: forward done, weight gradient not yet; most chunks
    whose weight gradients are pending: input gradient done, W not yet) on the rank."""
    held = pending = top_held = top_pending = 0
    for kind in _kinds(schedule, p, m, stage, costs):
        held += {Kind.F: 1, Kind.B: -1, Kind.W: -1}.get(kind, 0)
        pending += {Kind.I: 1, Kind.W: -1}.get(kind, 0)
        top_held, top_pending = max(top_held, held), max(top_pending, pending)
    return top_held, top_pending


@lru_cache(maxsize=256)
def held_peak(schedule: Schedule, p: int, m: int, stage: int, costs: tuple, w_share: float) -> float:
    """Most activation held at once, in chunk activations: a chunk counts 1 from its
    forward to its input-gradient pass (or whole backward), then ``w_share`` (what its W
    still reads, relative to the whole) until its W: the freeing that lets ZB-H1 keep
    1F1B's peak (Qi et al. 2024, section 2.1: W needs less memory than B)."""
    full, pending = _held_counts(schedule, p, m, stage, costs)
    return max(0.0, float((full + w_share * pending).max(initial=0.0)))


@lru_cache(maxsize=256)
def _held_counts(schedule: Schedule, p: int, m: int, stage: int, costs: tuple) -> tuple[np.ndarray, np.ndarray]:
    """After each item of the rank's steps: chunks held whole, chunks waiting for their W
    (float arrays: :func:`held_peak` weighs the second per ``w_share``, the same sum term by
    term as a walk of the items, once per schedule whatever the share)."""
    held = np.cumsum(np.array([_HELD[kind] for kind in _kinds(schedule, p, m, stage, costs)],
                              dtype=float).reshape(-1, 2), axis=0)
    return held[:, 0], held[:, 1]


_HELD = {Kind.F: (1, 0), Kind.B: (-1, 0), Kind.I: (-1, 1), Kind.W: (0, -1)}  # (whole, waiting for W) per item


def _kinds(schedule, p, m, stage, costs):
    return [kind for step in steps(schedule, p, m, stage, costs) for kind, _, _ in step]
