"""What a topology file says: :class:`FatTreeSpec`, the parameters of a cluster's fabric,
read from ``topologies/NAME.toml`` (or a path) and checked field by field against
:data:`FIELD_BOUNDS` (sim/bounds.py says why each bound ends where it does) and the
builders and routings known. :func:`sim.hardware.topology.fat_tree` builds the graph.

Run: ``python -m pytest -q tests/test_topology.py tests/test_bounds.py``
"""

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
import tomllib

from .. import bounds
from ..errors import InputError

TOPOLOGY_DIR = Path(__file__).resolve().parent / "topologies"  # package data: a link to the repository's topologies/


class Builder(StrEnum):
    """Which graph a topology file builds (``builder``; str-valued: equal to the file's strings)."""

    FAT_TREE = "fat_tree"  # NVLink domains on a rail-optimised fat tree (sim/hardware/topology.py)
    RAIL_ONLY = "rail_only"  # no switch joins two rails (sim/hardware/switching.py)
    XGMI_MESH = "xgmi_mesh"  # no NVSwitch: the node's GPUs linked pairwise (sim/hardware/mesh.py)


class Routing(StrEnum):
    """How a flow crosses the fat tree's core (``routing``)."""

    SPRAY = "spray"  # IB adaptive routing: sprayed evenly over the equal-cost paths
    ECMP = "ecmp"  # hashed onto one of them


@dataclass(frozen=True)
class FatTreeSpec:
    """Parameters of :func:`sim.hardware.topology.fat_tree`: what a topology file in topologies/ holds."""

    name: str
    gpus_per_domain: int = 8  # GPUs behind one NVSwitch fabric (the NVLink domain)
    gpus_per_node: int = 8  # GPUs per server: one IB rail per local GPU index
    nodes_per_su: int = 32  # servers per scalable unit (one leaf per rail per SU; DGX SuperPOD)
    spines: int = 16  # spine switches; every leaf has one uplink to each
    oversubscription: float = 1.0  # leaf downlink bandwidth / uplink bandwidth
    gpu: str = "h100-sxm"  # default GPU preset for this system
    nvlink_gbps: float | None = None  # GB/s per direction per GPU; default from the GPU
    nic_gbps: float | None = None  # GB/s per NIC; default from the GPU
    routing: Routing = Routing.SPRAY  # "spray": IB adaptive routing over equal paths | "ecmp": hash one
    max_gpus: int | None = None  # the most GPUs this system has (None: grows as asked)
    builder: Builder = Builder.FAT_TREE  # "rail_only": no switch joins two rails (Wang et al. 2023); "xgmi_mesh":
    #                            no NVSwitch, the node's GPUs linked pairwise (sim/hardware/mesh.py)
    planes: int = 1  # > 1: every NIC splits over this many independent switch planes
    sharp: bool = False  # the IB switches reduce in the network (SHARP; NCCL CollNet)
    nvls: bool = True  # the NVSwitches reduce and multicast (NVLink SHARP) where the GPU can

    @property
    def non_blocking_rails(self) -> bool:
        """A non-blocking rail-optimised fat tree of one plane: a leaf's uplinks carry what
        its NICs do, so a flow slowed on one link never slows other GPUs' flows on links
        they share, and every route is what :func:`sim.hardware.rails.placement` describes."""
        return self.oversubscription <= 1 and self.builder is Builder.FAT_TREE and self.planes == 1

    def __post_init__(self):
        """A file's (or a scenario override's) strings become :class:`Builder` and
        :class:`Routing` here, once (:func:`check_field` has refused unknown ones)."""
        object.__setattr__(self, "builder", Builder(self.builder))
        object.__setattr__(self, "routing", Routing(self.routing))


def load_spec(name_or_path: str, key: str = "cluster.topology") -> FatTreeSpec:
    """Read a topology file (:func:`topology_file`)."""
    path = topology_file(name_or_path)
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in TOPOLOGY_DIR.glob("*.toml")))
        raise InputError(key, f"unknown topology {name_or_path!r}; known presets: {known}")
    try:
        data = tomllib.loads(bounds.read_text(path, key))
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        raise InputError(key, f"{path}: malformed TOML ({exc or 'nested too deeply'})") from None
    return _spec_from_dict(data, path, key)


def topology_file(name_or_path: str) -> Path:
    """The file a ``cluster.topology`` value names: a preset by name (``dgx-h100``), a path
    to a TOML file, or ``topologies/NAME.toml``, a preset by its path in the repository
    (the repository's topologies/ folder is the package's sim/hardware/topologies): where
    no such file exists, as outside a checkout, the preset the package ships."""
    path = Path(name_or_path)
    if not path.suffix:
        return TOPOLOGY_DIR / f"{name_or_path}.toml"
    if not path.is_file() and path.parent == Path("topologies"):
        return TOPOLOGY_DIR / path.name
    return path


# Bounds of a spec's numeric fields (sim/bounds.py says why each ends where it does)
FIELD_BOUNDS = {"gpus_per_domain": bounds.DOMAIN, "gpus_per_node": bounds.DOMAIN,
                "nodes_per_su": bounds.NODES_PER_SU, "spines": bounds.SPINES,
                "oversubscription": bounds.OVERSUBSCRIPTION, "nvlink_gbps": bounds.LINK_GBPS,
                "nic_gbps": bounds.LINK_GBPS, "max_gpus": bounds.GPUS, "planes": bounds.PLANES}


def check_field(key: str, field: str, value, where: str = ""):
    """A spec field's value, checked as a topology file's (``where``: the file, for the
    message); InputError(key) for an unknown field, a wrong type, a value out of bounds or
    an unknown choice (builder, routing)."""
    fields = FatTreeSpec.__dataclass_fields__
    if field not in fields:
        raise InputError(key, f"{where}unknown key; known: {', '.join(fields)}")
    kind = str(fields[field].type)
    if field in ("name", "gpu", "routing", "builder") or kind.startswith(("bool", "<class 'bool'>")):
        expected = str if "bool" not in kind else bool
        if not isinstance(value, expected):
            raise InputError(key, f"{where}expected a {expected.__name__}, got {value!r}")
        if field == "builder" and value not in tuple(Builder):
            raise InputError(key, f"{where}unknown builder {value!r}; known: {', '.join(Builder)}")
        if field == "routing" and value not in tuple(Routing):
            raise InputError(key, f"{where}expected 'spray' or 'ecmp', got {value!r}")
        return value
    bound = FIELD_BOUNDS.get(field, bounds.Bound(1e-9, bounds.EXACT_INT, "a positive finite number"))
    try:  # counts must be whole; bandwidths and ratios may be fractional
        return bound.check(key, value, whole="float" not in kind)
    except InputError as exc:
        raise InputError(key, where + exc.reason) from None


def _spec_from_dict(data: dict, path: Path, key: str) -> FatTreeSpec:
    data = {k: check_field(f"{key}.{k}", k, v, f"{path}: ") for k, v in data.items()}
    data.setdefault("name", path.stem)
    spec = FatTreeSpec(**data)
    if spec.gpus_per_domain % spec.gpus_per_node and spec.gpus_per_node % spec.gpus_per_domain:
        raise InputError(f"{key}.gpus_per_domain", "must be a multiple or a divisor of gpus_per_node")
    if spec.builder is Builder.XGMI_MESH and (spec.gpus_per_domain != spec.gpus_per_node or spec.nvls or spec.planes > 1):
        raise InputError(f"{key}.builder", "an xGMI mesh is one node: gpus_per_domain = gpus_per_node, "
                                           "nvls = false, planes = 1")
    return spec


def segmented(spec: FatTreeSpec, segment: int, gpus: int, key: str = "cluster.segment") -> FatTreeSpec:
    """The fabric a job of ``gpus`` GPUs sees when Slurm places it in segments of ``segment``
    nodes (``sbatch --segment``): with the block topology plugin every segment's nodes sit in
    one block, here one NVLink domain (Slurm topology.conf "BlockName"/"BlockSizes" and sbatch
    ``--segment``: https://slurm.schedmd.com/topology.conf.html, https://slurm.schedmd.com/sbatch.html).
    Each run of ``segment`` consecutive nodes is then its own domain, the rest of the rack
    holding none of the job's GPUs: the domain the job sees is ``segment`` x gpus_per_node
    GPUs, and a scalable unit holds as many segments as it holds domains (its leaves serve the
    job's nodes of those domains). InputError(key) where the key means nothing (an NVLink
    domain of one node), does not fit the domain, or does not divide the job's nodes."""
    per, dom = spec.gpus_per_node, spec.gpus_per_domain
    if dom <= per:
        raise InputError(key, f"means nothing on topology {spec.name!r}: its NVLink domain is one node "
                              f"({dom} GPUs, gpus_per_node = {per})")
    if segment * per > dom:
        raise InputError(key, f"{segment} nodes x {per} GPUs = {segment * per} GPUs exceed the NVLink domain "
                              f"of {dom} GPUs")
    if gpus % per or (gpus // per) % segment:
        raise InputError(key, f"{segment} does not divide the job's nodes ({gpus} GPUs / {per} a node"
                              f" = {gpus / per:g})")
    if spec.nodes_per_su % (dom // per):
        raise InputError(key, f"needs whole NVLink domains in a scalable unit: nodes_per_su = {spec.nodes_per_su}"
                              f" is not a multiple of the domain's {dom // per} nodes")
    domains_per_su = spec.nodes_per_su // (dom // per)
    return dataclasses.replace(spec, gpus_per_domain=segment * per, nodes_per_su=segment * domains_per_su)
