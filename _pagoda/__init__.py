"""Pagoda: serve large language models on Kubernetes."""

__version__ = "0.1.0"
