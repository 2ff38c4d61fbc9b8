"""Gaussian noise on embedding tables: dense (DP-SGD) and on selected rows only (DP-FEST, DP-AdaFEST)."""
