"""Integrations with other engines than ComfyUI (diffusers); each imports its engine lazily."""
