"""The tiny pack and its kin for tests: seeded tiny weights, layouts, LoRAs, HDR LoRA and tokenizer."""
