"""Hardware: GPU presets (:mod:`.gpus`), cluster graphs and routes (:mod:`.topology`, files
in ``topologies/``), and what perturbs them (:mod:`.faults`: stragglers, jitter, degraded
links). Every constant cites its source where it is defined."""
