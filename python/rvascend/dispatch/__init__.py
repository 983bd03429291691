"""What a model calls at run time to reach the kernels: the per-projection routes
(packed BF16 and quantized, with their staleness checks), the kernel routes of
attention and the elementwise ops, the shape gate, the fused decode step, and
the weights generation. Below models/ (which call it) and above ops/ (the
kernels); rvascend.policy installs it into a model.
"""
