"""Where ranks sit: coordinates on the tp / cp / dp / pp axes and the process groups.

Megatron order by default: tp innermost (inside an NVLink domain), then cp, dp, and pp
outermost (across IB); ``parallel.order`` overrides it. Expert parallelism shards
experts over ``ep`` consecutive ranks of the combined dp*cp axis (Megatron's
expert-model-parallel groups live inside data parallelism).
"""

from dataclasses import dataclass
from functools import cached_property

from ..input.scenario import Parallel

AXES = ("tp", "cp", "dp", "pp")


class Group(tuple):
    """A tuple of ranks that remembers its hash: groups key many dicts in the engine."""

    def __hash__(self):
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = tuple.__hash__(self)
        return h


@dataclass(frozen=True)
class Layout:
    """Rank <-> (tp, cp, dp, pp) coordinates for one parallel section."""

    sizes: dict
    order: tuple[str, ...]
    ep: int

    @classmethod
    def from_parallel(cls, p: Parallel) -> "Layout":
        """The layout of a parallel section (its ``order`` was checked at load)."""
        return cls({"tp": p.tp, "cp": p.cp, "dp": p.dp, "pp": p.pp}, tuple(p.order.split("-")), p.ep)

    @cached_property
    def strides(self) -> dict:
        """Rank distance between neighbours on each axis."""
        out, stride = {}, 1
        for axis in self.order:
            out[axis] = stride
            stride *= self.sizes[axis]
        return out

    @property
    def world(self) -> int:
        """Total ranks."""
        return self.sizes["tp"] * self.sizes["cp"] * self.sizes["dp"] * self.sizes["pp"]

    def coords(self, rank: int) -> dict:
        """{axis: index} of a rank."""
        return {a: (rank // self.strides[a]) % self.sizes[a] for a in AXES}

    def rank(self, **coords) -> int:
        """Rank at the given coordinates."""
        return sum(coords[a] * self.strides[a] for a in AXES)

    @cached_property
    def _groups(self) -> dict:
        return {}

    def group(self, rank: int, *axes: str) -> tuple[int, ...]:
        """Ranks sharing every coordinate of ``rank`` except ``axes`` (first axis varies
        fastest). Cached: every op of a rank asks for the same few groups."""
        key = (rank, axes)
        found = self._groups.get(key)
        if found is None:
            base = rank - sum(self.coords(rank)[a] * self.strides[a] for a in axes)
            members = [base]
            for axis in axes:
                stride = self.strides[axis]
                members = [m + i * stride for i in range(self.sizes[axis]) for m in members]
            found = self._groups[key] = Group(members)
        return found

    def dc_index(self, rank: int) -> int:
        """Position on the combined cp*dp axis (cp fastest)."""
        c = self.coords(rank)
        return c["cp"] + self.sizes["cp"] * c["dp"]

    def ep_group(self, rank: int) -> tuple[int, ...]:
        """The ``ep`` ranks that share one set of experts' tokens (same tp and pp)."""
        grad = self.group(rank, "cp", "dp")
        start = self.dc_index(rank) // self.ep * self.ep
        return Group(grad[start:start + self.ep])

    def expert_dp_group(self, rank: int) -> tuple[int, ...]:
        """Ranks holding the same experts: gradients of expert weights reduce over these."""
        grad = self.group(rank, "cp", "dp")
        return Group(grad[self.dc_index(rank) % self.ep::self.ep])

    def stage_rank(self, rank: int, stage: int) -> int:
        """The rank at pipeline stage ``stage`` with the other coordinates of ``rank``."""
        return self.rank(**{**self.coords(rank), "pp": stage})
