"""Parallelism: scenario -> rank programs. One module per parallelism (torchtitan style),
each adding its ops to a rank's program: :mod:`.tp`, :mod:`.cp`, :mod:`.ep`, :mod:`.pp`,
:mod:`.dp`, :mod:`.zero`, :mod:`.fsdp`; :mod:`.layout` places ranks, :mod:`.params` says
which parameters a rank holds, :mod:`.program` builds ops, :mod:`.workload` composes a
step and folds identical ranks, :mod:`.memory` estimates peak memory per GPU."""
