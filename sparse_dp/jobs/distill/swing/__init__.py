"""Swing distillation on a next-item softmax model: dynamic temperature and soft target
protection (:mod:`.temperature`), the model (:mod:`.model`), its data and canaries
(:mod:`.swing_data`), metrics (:mod:`.metrics`), flags (:mod:`.flags`) and the job
(:mod:`.swing_job`)."""
