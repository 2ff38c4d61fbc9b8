"""``sparse-dp train``: the pCTR job, its flags, fitting, calibration and step clock."""
