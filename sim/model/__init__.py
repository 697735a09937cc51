"""Model costs: a transformer's sizes, parameters and FLOPs (:mod:`.transformer`), its
kernels per layer (:mod:`.layers`), their time on a GPU (:mod:`.compute`), and MoE routers
that decide expert loads (:mod:`.routing`). Nothing here knows about parallel layouts."""
