"""The input edge: the scenario schema (:mod:`.scenario`), model presets and Hugging Face
configs (:mod:`.presets`), and loading with every cross-field rule (:mod:`.load`). A bad
value raises :class:`sim.errors.InputError` naming the key; inside, data is trusted."""
