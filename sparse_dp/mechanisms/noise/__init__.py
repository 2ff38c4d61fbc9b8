"""Gaussian noise on embedding tables: dense (DP-SGD), selected rows only (DP-FEST, DP-AdaFEST)."""
