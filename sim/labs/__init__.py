"""Failure-mode labs: real arithmetic for the ways pretraining runs fail (the seeds).

- :mod:`sim.labs.routing`: MoE routers over real scores and a causality checker
  (expert choice and token dropping let token n+k change token n's experts).
- :mod:`sim.labs.numerics`: gradient reductions in fp16 / bf16 / fp32 in the order a
  ring or a tree adds them, against an exact sum (small gradients swamped by a large
  running sum: a bias that compounds with the rank count).
"""
