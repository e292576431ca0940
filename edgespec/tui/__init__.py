"""``edgespec chat``: a terminal chat that shows speculation at work.

- ``session.py``  the conversation on the generation worker (``worker.py``; no UI): method /
  temperature switches, KV reuse across turns, answer updates carrying the engine's drafted /
  target-produced text segments, the sampling defaults (``generation_defaults.py``)
- ``render.py``   the two token styles, safe display text, ANSI for line mode
- ``app.py``      the Textual app (``widgets.py``, ``screens.py``), awaiting the worker's jobs
- ``plain.py``    the line-based fallback for pipes and minimal terminals
- ``cli.py``      the click command ``chat``
"""
