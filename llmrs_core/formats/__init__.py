"""Model file formats: GGUF (chapters 1, 6, 10); safetensors arrives in chapter 10."""
