"""Sequence-parallel stage 1: the split forward, its denoise loop and the `mx.distributed` group."""
