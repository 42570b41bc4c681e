"""Admission: a submitted render's media and LoRAs checked before anything is queued (the media probe and its child process, the media rules, the LoRA checks)."""
