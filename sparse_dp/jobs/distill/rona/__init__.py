"""RONA (Wang et al., AAAI 2019) on the pCTR model: the job (:mod:`.rona_job`), the teacher's
sanitized answers (:mod:`.answers`), their privacy cost (:mod:`.privacy`) and the
query-sample selection (:mod:`.query_selection`)."""
