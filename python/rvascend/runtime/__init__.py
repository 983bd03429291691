"""What every layer may use: the allocator's settings (glibc's thresholds, freeing
the heap), the project's private cache folder, and pinned downloads checked by
sha256. Imports nothing of the package above it.
"""
