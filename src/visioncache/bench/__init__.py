"""``visioncache bench``: a real-traffic workload run with and without the cache, side by side.

The workload (``workload``), the measurements (``report``) and the chart (``plot``) are
engine-agnostic so every engine's runner reuses them; ``models`` and ``transformers_runner`` are
the Hugging Face transformers engine.
"""
