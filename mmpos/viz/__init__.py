"""Plots and figures."""

from .spectrum import encoding_figure, frequency_matrix, logit_map, plot_logit_map, plot_spectrum

__all__ = ["encoding_figure", "frequency_matrix", "logit_map", "plot_logit_map", "plot_spectrum"]
