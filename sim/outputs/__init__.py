"""Outputs of a run: the summary (:mod:`.metrics`), the spans table (:mod:`.result`), the
critical path (:mod:`.attribution`), which ranks to show (:mod:`.rank_selection`), Chrome
traces (:mod:`.trace`) and PNG timelines (:mod:`.timeline`)."""
