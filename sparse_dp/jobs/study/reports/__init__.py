"""What a study writes from its JSON report: the paper's claims checked, markdown tables, plots."""
