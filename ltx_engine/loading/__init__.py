"""Packs and weights: pack folders and checkpoints, the strict loader, model classes, the warm-model registry, block streaming."""
