"""The engine: SimPy executes rank programs on streams (:mod:`.core`) over a max-min fair
flow model of the network (:mod:`.network`)."""
