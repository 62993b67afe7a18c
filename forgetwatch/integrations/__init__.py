"""Adapters from training frameworks' events to a Watch."""
