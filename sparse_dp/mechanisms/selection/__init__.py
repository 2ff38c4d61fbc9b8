"""Which rows get an update.

DP-AdaFEST's noisy contribution map and threshold with geometric false positives,
DP-FEST's private top-k preselection.
"""
