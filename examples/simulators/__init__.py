"""Simulators of vLLM's scheduler plugged into the harness through the adapter kit."""
