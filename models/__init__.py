"""Model configs and their resolution to local HF directories (no hub downloads on CPU machines)."""
