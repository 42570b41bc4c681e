"""LoRAs on the models: fused on load, run-time adapters, the dev DiT with its distilled LoRA."""
