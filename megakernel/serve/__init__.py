"""An OpenAI-compatible server for the megakernel runtime: ``python -m megakernel.serve``.

``engine`` runs continuous batching over a ``MegaQwen3`` in one thread, ``api`` is the FastAPI
app (completions, chat completions, models, health, Prometheus metrics), ``text`` turns prompts
into ids and ids back into text, ``server`` is the command line.
"""

from .server import build, main

__all__ = ["build", "main"]
