"""Helpers every layer uses: files, strict JSON, messages, console, ranks."""
