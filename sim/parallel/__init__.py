"""Parallelism: scenario -> rank programs. One module per parallelism (torchtitan style),
each adding its ops to a rank's program: :mod:`.tp`, :mod:`.cp`, :mod:`.ep`, :mod:`.pp`,
:mod:`.dp`, :mod:`.zero`, :mod:`.fsdp`, and the overlap mechanisms :mod:`.tp_overlap`
(TE userbuffers) and :mod:`.ep_overlap` (combined 1F1B); :mod:`.layout` places ranks (and
the expert mesh), :mod:`.params` says which parameters a rank holds, :mod:`.passes` runs a
chunk's layers, :mod:`.program` builds ops, :mod:`.workload` composes a step and folds
identical ranks, :mod:`.memory` estimates peak memory per GPU; :mod:`.layer_program` is
what the builder produces for one layer of each kind and one micro-batch (the interface the
work census and the planner read), :mod:`.census` counts a run's ops from it."""
