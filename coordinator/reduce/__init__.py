"""The reducer: the coordinator's own numpy tasks between tiled forwards (tile cut and blend, the guided step, the encode blend)."""
