"""safetensors files: the JSON header alone, validated as strictly as the format demands."""
