"""Hugging Face layouts: ``*.index.json`` sharded sets over safetensors or .bin shards."""
