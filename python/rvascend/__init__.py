"""rvascend: hand-written RVV and AscendC kernels for LLM inference, driven from Python."""

__version__ = "0.1.0"
