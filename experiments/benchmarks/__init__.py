"""The pieces of ``linformer-lab bench``: cases, measurement, decode, training loop, report."""
